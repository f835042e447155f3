"""The Python API page's examples run as written: its ```python blocks, in order, as one
session from a folder that holds the repository's examples (```py blocks are shown, not
run: they need an API key)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

PAGE = ROOT / "docs" / "python-api.md"


def runnable_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", markdown, re.S | re.M)


def test_the_python_api_examples_run(tmp_path: Path) -> None:
    blocks = runnable_blocks(PAGE.read_text())
    assert len(blocks) >= 5
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    script = tmp_path / "session.py"
    script.write_text("\n".join(blocks))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert re.search(r"^ok 5/5 trials$", out, re.M), out
    assert re.search(r"^incorrect False$", out, re.M), out
    assert re.search(r"^best: [\d.]+x", out, re.M), out
    assert "error: examples/tasks: no task file with id 99" in out
    assert list((tmp_path / "pike-runs").glob("1_GeluMLP-*/best.py"))
