"""Which code the guards count as a library's: the usual install layout, and any import root
the interpreter had before the candidate loaded, unless the candidate could write there."""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

import pytest

from pike.evaluate import guards as guards_module
from pike.evaluate.guards import Guards, library_roots

# A library that starts a monitor thread which idles between its checks, as tqdm's does.
_MONITOR = '''
import threading

class Monitor(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True, name="monitor")
        self.stop = threading.Event()

    def run(self):
        while not self.stop.wait(0.05):
            pass
'''


def test_import_roots_count_unless_the_child_may_write_or_holds_its_file_there(
        tmp_path: Path) -> None:
    libs = tmp_path / "site"
    work = tmp_path / "work"
    candidate_dir = tmp_path / "cand"
    for folder in (libs, work, candidate_dir):
        folder.mkdir()
    (work / "out" / "site").mkdir(parents=True)
    roots = library_roots([str(libs), str(tmp_path), "", "relative/dir", str(work),
                           str(candidate_dir), str(tmp_path / "missing"),
                           str(work / "out" / "site")],
                          untrusted=[str(work / "out"), str(candidate_dir / "model.py")])
    # tmp_path holds both; work holds the child's own; work/out/site lies in it
    assert roots == (f"{libs}/",)


@pytest.mark.parametrize("trusted", [True, False])
def test_an_idle_thread_of_a_library_outside_the_usual_layout_is_no_violation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trusted: bool) -> None:
    libs = tmp_path / "plain_folder"  # no "/lib/python3" in its path
    libs.mkdir()
    (libs / "idle_monitor.py").write_text(_MONITOR)
    writable = [str(tmp_path / "out")] if trusted else [str(libs)]
    monkeypatch.setattr(guards_module, "_library_roots",
                        library_roots([str(libs)], untrusted=writable))
    spec = importlib.util.spec_from_file_location("idle_monitor", libs / "idle_monitor.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    guards = Guards(writable=writable)
    guards._snapshot = guards_module._integrity_snapshot()  # what install() takes
    guards._threads = {t.ident or 0 for t in threading.enumerate()}
    monitor = module.Monitor()
    monitor.start()
    try:
        guards.check_after("check")
    finally:
        monitor.stop.set()
        monitor.join()
    if trusted:
        assert guards.violations == []
    else:  # code the child could have written itself is the candidate's
        assert guards.violations == ["a thread that outlives the call (monitor, seen after "
                                     "check)"]
