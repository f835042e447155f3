"""The bodies of the `pike` commands, one module per family, with what they share (consoles
and exit statuses, options, interrupts), so that no one module carries the whole command
line. pike.cli keeps the typer app, its global options and the order the help lists the
commands in."""
