"""What pike shows people: live progress now; tables, figures and HTML reports later."""


def __getattr__(name: str) -> object:
    # the report pulls in matplotlib; the live progress line under `pike optimize` stays light
    if name == "build_report":
        from pike.report.build import build_report

        return build_report
    raise AttributeError(f"module 'pike.report' has no attribute {name!r}")
