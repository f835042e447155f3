"""What pike shows people: live progress now; tables, figures and HTML reports later."""
