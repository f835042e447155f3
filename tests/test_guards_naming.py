"""The guards against code passed off as a library's, trick by trick, in one guarded
interpreter: each way of giving code a library's file name (or of running the candidate's
code where the guards look only at names) is refused, and the honest imports beside them
are not. The whole-evaluation cheats of this family are in tests/test_guards.py."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

LIB = "/usr/lib/python3.11/_spin_helper.py"

# name -> code run with the guards armed; True: it must be refused
TRICKS = {
    # a syntax tree: the compile event names no file
    "compiles_a_syntax_tree": (True, "compile(ast.parse('x = 1'), LIB, 'exec')"),
    # renames a code object in place, with no audit event
    "fixes_co_filename": (True, "_imp._fix_co_filename(compile('x = 1', OWN, 'exec'), LIB)"),
    # replace() called from one of importlib's frozen frames
    "replaces_through_importlib": (True, textwrap.dedent("""\
        importlib._bootstrap._call_with_frames_removed(
            compile('x = 1', OWN, 'exec').replace, co_filename=LIB)""")),
    # a thread pool's worker makes the code: a stack of the standard library alone
    "compiles_in_a_pool": (True, textwrap.dedent("""\
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(compile, 'x = 1', LIB, 'exec').result()""")),
    "unmarshals_in_a_pool": (True, textwrap.dedent("""\
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(marshal.loads, marshal.dumps(compile('x = 1', OWN, 'exec'))).result()""")),
    # honest: imports that read the files they name, and the candidate's own names
    "imports_the_standard_library": (False, "import colorsys, this"),
    "imports_its_folder": (False, textwrap.dedent("""\
        sys.path.insert(0, PLAIN)
        import plain_helper""")),
    "compiles_under_its_own_name": (False, "exec(compile('x = 1', OWN, 'exec'), {})"),
}

RUNNER = """
import _imp, ast, concurrent.futures, importlib, json, marshal, os, sys
import torch
from pike.evaluate.guards import Guards

LIB, OWN, PLAIN = sys.argv[1], sys.argv[2], sys.argv[3]
tricks = json.loads(sys.argv[4])
guards = Guards(writable=[os.getcwd()])
guards.install()
refused = {}
for name, code in tricks.items():
    before = len(guards.violations)  # a refusal said before is not listed again
    guards.armed = True
    try:
        exec(code, {**globals()})
        refused[name] = guards.violations[before:]
    except PermissionError as err:
        refused[name] = [str(err)]
    finally:
        guards.armed = False

# a thread of the candidate's whose target torch wraps: torch's file name, its own loop
import threading, time
stop = threading.Event()

def spin():
    while not stop.is_set():
        time.sleep(0.01)

worker = threading.Thread(target=torch.no_grad()(spin), daemon=True)
worker.start()
before = len(guards.violations)
guards.check_after("forward")
refused["thread_with_a_torch_wrapped_target"] = guards.violations[before:]
stop.set()
worker.join()
print(json.dumps(refused))
"""


def test_each_way_of_naming_code_after_a_library_is_refused_and_imports_are_not(
        tmp_path: Path) -> None:
    work, plain = tmp_path / "work", tmp_path / "plain"
    work.mkdir()
    plain.mkdir()
    (plain / "plain_helper.py").write_text("VALUE = 1\n")
    # its cached code, as an earlier run of the user's would have left it
    subprocess.run([sys.executable, "-c", "import plain_helper"], cwd=plain, check=True)
    runner = tmp_path / "runner.py"
    runner.write_text(RUNNER)
    done = subprocess.run(
        [sys.executable, str(runner), LIB, str(work / "own.py"), str(plain),
         json.dumps({name: code for name, (_, code) in TRICKS.items()})],
        cwd=work, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    refused = json.loads(done.stdout.strip().splitlines()[-1])
    wrong = {name: refused[name] for name, (must, _) in TRICKS.items()
             if bool(refused[name]) != must}
    assert not wrong, wrong
    assert any("thread" in v for v in refused["thread_with_a_torch_wrapped_target"])


def test_paths_that_reach_a_writable_folder_under_another_prefix_are_no_librarys(
        tmp_path: Path) -> None:
    from pike.evaluate import guards

    writable = str(tmp_path) + "/"
    saved = guards._untrusted_dirs
    guards._untrusted_dirs = (writable,)
    try:
        own = f"{tmp_path}/torch/_evil.py"
        assert not guards._library_file(own)
        for disguised in ("/proc/self/cwd/torch/_evil.py", f"/proc/self/root{own}",
                          f"/{own}", f"/.{own}", f"{tmp_path}/x/../torch/_evil.py"):
            assert not guards._library_file(disguised), disguised
        assert guards._library_file("/usr/lib/python3/dist-packages/torch/nn/functional.py")
    finally:
        guards._untrusted_dirs = saved
