"""A child begins only where the host's memory has room for what its task's children take."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pike.config import EvalConfig
from pike.evaluate import evaluate, host_memory, sandbox
from pike.evaluate.host_memory import HostMemory
from pike.evaluate.reference_cache import close_references
from pike.task import Task

GIB = 2**30


@dataclass(eq=False)
class Child:
    """What the gate reads of a sandbox.ChildProcess."""

    last_rss_bytes: int | None = None
    peak_rss: int = 0
    last_files_bytes: int = 0
    peak_files: int = 0
    phase: str = "setup"
    dead: bool = False
    # the phases it ended: by default it has run its checks, and so measured its task
    phase_seconds: dict[str, float] = field(default_factory=lambda: {"check": 1.0})

    def ended(self) -> bool:
        return self.dead


class Host:
    """A host whose available memory the test sets; each sleep of the gate is counted."""

    def __init__(self, available: int) -> None:
        self.available, self.sleeps = available, 0
        self.on_sleep: list = []

    def sleep(self, _: float) -> None:
        self.sleeps += 1
        for step in self.on_sleep:
            step()


def _gate(host: Host, **kw: float) -> HostMemory:
    return HostMemory(available=lambda: host.available, headroom=2 * GIB,
                      sleep=host.sleep, **kw)


def test_a_child_begins_at_once_where_no_other_is_begun() -> None:
    host = Host(available=1 * GIB)  # less than the headroom: nothing else to wait for
    gate = _gate(host)
    assert gate.admit(Child(), "a") == 0.0 and host.sleeps == 0


def test_a_child_waits_until_what_its_task_took_fits_beside_the_others() -> None:
    host = Host(available=100 * GIB)
    gate = _gate(host)
    first = Child(peak_rss=30 * GIB)
    gate.admit(first, "a")
    gate.release(first)  # the reference: it took 30 GiB, so will each child of "a"
    assert gate.expected("a") == 30 * GIB
    running = Child(last_rss_bytes=30 * GIB, peak_rss=30 * GIB)
    gate.admit(running, "a")
    host.available = 20 * GIB  # the host's other users and that child hold the rest
    waiting = Child()
    freed = [lambda: setattr(host, "available", 60 * GIB) if host.sleeps == 3 else None]
    host.on_sleep = freed
    gate.admit(waiting, "a")
    assert host.sleeps == 3  # it began only once 30 GiB + the headroom were free


def test_children_begun_but_still_loading_count_what_they_will_take() -> None:
    # Two children of a 30 GiB task just begun: the host shows them at 1 GiB each, but
    # they will take 58 GiB more, so a third does not fit in 70 GiB available.
    host = Host(available=70 * GIB)
    gate = _gate(host)
    done = Child(peak_rss=30 * GIB)
    gate.admit(done, "a")
    gate.release(done)
    loading = [Child(last_rss_bytes=GIB), Child(last_rss_bytes=GIB)]
    for child in loading:
        gate.admit(child, "a")
    host.on_sleep = [lambda: [setattr(c, "last_rss_bytes", 30 * GIB) for c in loading],
                     lambda: setattr(host, "available", 20 * GIB + 32 * GIB)]
    gate.admit(Child(), "a")
    assert host.sleeps == 1  # 52 GiB free once they had loaded: 30 + 2 fit


def test_a_task_nobody_measured_yet_is_expected_to_take_the_most_any_took() -> None:
    gate = _gate(Host(available=100 * GIB))
    big, small = Child(peak_rss=40 * GIB), Child(peak_rss=GIB)
    for child, task in ((big, "big"), (small, "small")):
        gate.admit(child, task)
        gate.release(child)
    assert gate.expected("new") == 40 * GIB
    assert gate.expected("small") == GIB  # its own children's, not the largest
    growing = Child(peak_rss=5 * GIB)
    gate.admit(growing, "small")  # a begun child that grew past what its task took
    assert gate.expected("small") == 5 * GIB


def test_no_child_waits_longer_than_the_longest_wait(caplog: pytest.LogCaptureFixture) -> None:
    # A kept reference holds its memory for its task's whole search: on a host too small
    # for it and one candidate, the candidate still begins, as before the gate.
    host = Host(available=10 * GIB)
    gate = HostMemory(available=lambda: host.available, headroom=2 * GIB,
                      longest_wait_s=0.3)
    reference = Child(last_rss_bytes=30 * GIB, peak_rss=30 * GIB)
    gate.admit(reference, "a")
    waited = gate.admit(Child(), "a")
    assert 0.3 <= waited < 5
    assert "without the host memory it is expected to take" in caplog.text


def test_children_of_several_threads_do_not_all_pass_at_once() -> None:
    # Room for one more 30 GiB child, four threads asking at once: one begins, the others
    # wait, each seeing the one before as still to load.
    host = Host(available=34 * GIB)
    gate = HostMemory(available=lambda: host.available, headroom=2 * GIB,
                      longest_wait_s=1.0)
    done = Child(peak_rss=30 * GIB)
    gate.admit(done, "a")
    gate.release(done)
    gate.admit(Child(last_rss_bytes=30 * GIB), "a")  # one running, fully loaded
    begun, waited = [], []

    def one() -> None:
        child = Child(last_rss_bytes=0)
        waited.append(gate.admit(child, "a"))
        begun.append(child)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert sorted(w < 0.2 for w in waited) == [False, False, False, True]


@pytest.fixture
def no_kept_reference() -> Iterator[None]:
    """No reference child kept from another test (its gate would be another), none left."""
    close_references()
    yield
    close_references()


def test_an_idle_kept_child_counts_its_own_peak_not_its_tasks() -> None:
    # A kept reference of 8 GiB, idle, in a task whose candidates took 24 GiB: it takes
    # no more than it holds, and a new 24 GiB candidate fits in what is free (helper-28's
    # review: four such tasks kept a new candidate waiting its whole limit).
    host = Host(available=83 * GIB)
    gate = _gate(host, longest_wait_s=0.5)
    for task in "abcd":
        done = Child(peak_rss=24 * GIB)
        gate.admit(done, task)
        gate.release(done)
        gate.admit(Child(last_rss_bytes=8 * GIB, peak_rss=8 * GIB, phase="idle"), task,
                   role="reference")
    assert gate.admit(Child(), "a") == 0.0 and host.sleeps == 0
    loading = Child(last_rss_bytes=GIB, phase="load")
    gate.admit(loading, "b")  # 23 GiB still to come: 83 - 23 = 60 >= 24 + 2
    assert host.sleeps == 0


def test_references_and_candidates_are_expected_apart() -> None:
    gate = _gate(Host(available=100 * GIB))
    for child, role in ((Child(peak_rss=40 * GIB), "reference"), (Child(peak_rss=6 * GIB),
                                                                   "candidate")):
        gate.admit(child, "a", role=role)
        gate.release(child)
    assert gate.expected("a", "reference") == 40 * GIB  # its baseline's builds
    assert gate.expected("a", "candidate") == 6 * GIB
    assert gate.expected("b", "candidate") == 6 * GIB  # the largest candidate's


def test_a_child_counted_at_once_does_not_wait() -> None:
    # A reference started under the reference cache's lock, or one renewed with the device
    # held alone, is counted at once: nobody waits behind a lock or a hold for memory.
    host = Host(available=GIB)
    gate = _gate(host)
    gate.admit(Child(last_rss_bytes=30 * GIB, peak_rss=30 * GIB, phase="idle"), "a")
    assert gate.admit(Child(), "a", role="reference", limit_s=0.0) == 0.0
    assert host.sleeps == 0


def test_a_child_killed_while_it_waits_begins_at_once() -> None:
    # The killer takes the waiting candidate (first in line for it): its crash is reported
    # at once instead of after the whole wait.
    host = Host(available=GIB)
    gate = _gate(host)
    gate.admit(Child(last_rss_bytes=30 * GIB, peak_rss=30 * GIB, phase="check"), "a")
    waiting = Child()
    host.on_sleep = [lambda: setattr(waiting, "dead", True)]
    gate.admit(waiting, "a")
    assert host.sleeps == 1


@pytest.mark.usefixtures("no_kept_reference")
def test_a_real_evaluations_children_are_counted_waited_for_and_released(
        mlp_task: Task, fast_config: EvalConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    """One evaluation on the CPU (each is seconds of CI): each child waits before its
    device hold, the cached reference waits for room as well (it is made outside the
    cache's lock, so its wait holds no other task's evaluations), the wait is a step of the
    verdict that the offline budget leaves out, and every child is released and measured."""
    from pike.evaluate import judge, reference_start
    from pike.search.offline import _stood

    order: list[str] = []

    class Recorded(HostMemory):
        def admit(self, child: object, task: str, role: str = "candidate",
                  limit_s: float | None = None) -> float:
            order.append(f"admit {role} {limit_s}")
            super().admit(child, task, role, limit_s)  # type: ignore[arg-type]
            return 1.5 if role == "candidate" else 0.0  # as if it had waited

    def hold_for_build(*_: object) -> object:
        order.append("hold")
        return contextlib.nullcontext()

    files: dict[str, int] = {}

    class Recorded(Recorded):  # type: ignore[no-redef]
        def release(self, child: object) -> None:
            role = child.request.role  # type: ignore[attr-defined]
            files[role] = max(files.get(role, 0), child.peak_files)  # type: ignore[attr-defined]
            super().release(child)  # type: ignore[arg-type]

    gate = Recorded()
    monkeypatch.setattr(host_memory, "HOST", gate)
    # no periodic reads: the reference's files are read once more when its trials end,
    # before it is released and before its expected outputs leave the folder
    monkeypatch.setattr(sandbox, "_FILES_EVERY_S", 1e9)
    monkeypatch.setattr(judge, "hold_for_build", hold_for_build)
    monkeypatch.setattr(reference_start, "hold_for_build", hold_for_build)
    verdict = evaluate(mlp_task, mlp_task.source.replace("class Model", "class ModelNew")
                       + "\nclass Model(ModelNew):\n    pass\n", fast_config)
    assert verdict.status in ("ok", "rejected", "incorrect"), verdict.message
    # each child waits for room before its device hold: the reference's before its start,
    # the candidate's before its own (a third, where it was timed: its timed sets' load)
    holds = [at for at, step in enumerate(order) if step == "hold"]
    assert [order[at - 1] for at in holds[:2]] == ["admit reference None",
                                                    "admit candidate None"]
    assert len(holds) in (2, 3), order
    assert "admit reference None" in order  # the cached reference: waits as they do
    assert verdict.steps.get("wait_for_memory", 0.0) >= 1.5 and _stood(verdict) >= 1.5
    assert len(gate._begun) == 1  # the reference's child, kept for the next candidate
    from pike.evaluate import check, reference_cache
    run = next(iter(reference_cache._references.values()))
    written = sum(check.leaves_bytes(leaves) for leaves in run.expected)
    close_references()
    assert gate._begun == {}  # it and the candidate's: both ended
    assert gate.expected(mlp_task.sha256) > 50 * 2**20  # a child imports torch at least
    from pike.evaluate.held_files import in_memory
    from pike.evaluate.leftovers import scratch_root
    if in_memory(scratch_root()):  # its inputs and expected outputs, in host memory
        assert files["reference"] >= written > 0
        assert gate.expected(mlp_task.sha256, "reference") > files["reference"]


def test_a_waiting_child_has_idle_kept_children_closed_before_it_waits_longer() -> None:
    """An idle kept reference holds its memory for nothing: a child that would wait for it
    has it closed (the cache's least recently used idle one) instead of waiting out the
    gate's longest wait; one that fits closes nothing."""
    host = Host(available=40 * GIB)
    gate = _gate(host, longest_wait_s=60.0)
    kept = [Child(last_rss_bytes=30 * GIB, peak_rss=30 * GIB, phase="idle")]
    for child in kept:
        gate.admit(child, "a", role="reference")
    closed: list[Child] = []

    def free_one() -> bool:
        if not kept:
            return False
        child = kept.pop()
        gate.release(child)
        host.available += 30 * GIB  # its process ended
        closed.append(child)
        return True

    gate.reclaim_with(free_one)
    small = Child(peak_rss=5 * GIB)
    gate.admit(small, "b")  # fits beside it: nothing closed
    assert closed == [] and host.sleeps == 0
    gate.release(small)
    big = Child()
    gate._peak[("c", "candidate")] = 50 * GIB
    waited = gate.admit(big, "c")
    assert len(closed) == 1 and host.sleeps == 0 and waited < 5


def test_a_reference_s_files_in_memory_count_with_its_rss() -> None:
    """A level1 reference held 7.6 GiB of RSS and 56 GiB of inputs and expected outputs in
    /dev/shm: the gate expects its task's next reference, and an unmeasured task's, to take
    both, and counts a loading child's files as what it already holds."""
    host = Host(available=100 * GIB)
    gate = _gate(host)
    big = Child(last_rss_bytes=7 * GIB, peak_rss=7 * GIB, last_files_bytes=56 * GIB,
                peak_files=56 * GIB, phase="idle")
    gate.admit(big, "k7", "reference")
    gate.release(big)
    assert gate.expected("k7", "reference") == 63 * GIB
    assert gate.expected("another", "reference") == 63 * GIB
    # begun and loading, with 20 of its 56 GiB of files written: 43 GiB still to come
    loading = Child(last_rss_bytes=7 * GIB, peak_rss=7 * GIB, last_files_bytes=20 * GIB,
                    peak_files=20 * GIB, phase="check")
    gate.admit(loading, "k7", "reference", limit_s=0)
    assert gate._coming(loading, "k7", "reference") == 36 * GIB


def test_a_new_task_s_reference_waits_past_the_longest_wait_while_other_tasks_run() -> None:
    """Starting it anyway after the gate's wait put two 56 GiB references on a 125 GiB host;
    a new task can wait for the running ones, which end."""
    host = Host(available=20 * GIB)
    gate = _gate(host, longest_wait_s=0.0)
    running = Child(last_rss_bytes=8 * GIB, peak_rss=8 * GIB, last_files_bytes=56 * GIB,
                    peak_files=56 * GIB, phase="idle")
    gate.admit(running, "k7", "reference")
    candidate = Child(phase="timing")
    host.on_sleep = [lambda: host.sleeps == 50 and gate.release(running)]
    gate.admit(Child(), "k9", "reference")  # expected at k7's 64 GiB, as nobody measured it
    assert host.sleeps == 50  # waited far past longest_wait_s, until k7's reference ended
    # a running task's candidate still waits only the gate's longest wait
    gate2 = _gate(Host(available=20 * GIB), longest_wait_s=0.0)
    gate2.admit(Child(last_rss_bytes=64 * GIB, peak_rss=64 * GIB, phase="idle"), "k7",
                "reference")
    assert gate2.admit(candidate, "k7") < 1


def test_a_new_task_s_reference_waits_while_another_new_footprint_is_measured() -> None:
    """Four references began at once on that bench, none measured: each new one now
    begins after the one before has loaded, with its footprint known."""
    host = Host(available=120 * GIB)
    gate = _gate(host)
    first = Child(last_rss_bytes=GIB, peak_rss=GIB, phase="check")
    gate.admit(first, "k7", "reference")
    second = Child()

    def first_loads() -> None:
        if host.sleeps == 5:  # its files written: measured, loaded, idle
            first.last_files_bytes = first.peak_files = 56 * GIB
            first.phase = "idle"
            host.available = 120 * GIB - 57 * GIB

    host.on_sleep = [first_loads]
    gate.admit(second, "k9", "reference", limit_s=60)
    assert host.sleeps == 5  # waited for k7's to load, then fitted beside it (57 + 2 < 63)
    # a candidate of the task whose reference loads is not held by that rule (only by
    # memory: k9's reference and k7's candidate, both loading, are expected at 57 GiB)
    gate.admit(Child(), "k7", "candidate", limit_s=0)
    third = Child(phase="setup")
    host.available = 500 * GIB
    assert gate._fits("k9", "candidate")
    assert not gate._fits("k3", "reference")  # k9's reference (new) still loads
    gate.admit(third, "k3", "reference", limit_s=0)  # counted at once where told


def test_a_task_s_first_candidate_is_expected_at_its_reference_until_measured_past_loading(
        ) -> None:
    """On the H100's level1 bench the first of task 7's candidates, measured at 0.6 GiB as
    it began, let two more of its task begin beside it, and the host's out-of-memory
    killer took them: a child still loading has not shown its size. Until one of the
    task's candidates is past loading, the next is expected at the most any candidate
    took or at its task's reference, whichever is larger; after, at its own."""
    host = Host(available=60 * GIB)
    gate = _gate(host, longest_wait_s=0.0)
    small = Child(peak_rss=3 * GIB)
    gate.admit(small, "k2")
    gate.release(small)  # another task's candidates took 3 GiB
    reference = Child(last_rss_bytes=4 * GIB, peak_rss=4 * GIB, last_files_bytes=28 * GIB,
                      peak_files=28 * GIB, phase="idle")
    gate.admit(reference, "k7", "reference")
    first = Child(last_rss_bytes=GIB // 2, peak_rss=GIB // 2, phase="check")
    gate.admit(first, "k7")
    assert gate.expected("k7") == 32 * GIB  # its reference's, not the 0.5 GiB seen so far
    host.available = 60 * GIB - 28 * GIB - 5 * GIB
    assert not gate._fits("k7", "candidate")  # 27 GiB less the first's 31.5 to come
    # one that failed in its import says nothing of the task's size
    failed = Child(last_rss_bytes=GIB // 2, peak_rss=GIB // 2, phase="cleanup",
                   phase_seconds={"setup": 0.1, "load": 2.0})
    gate.admit(failed, "k7", limit_s=0)
    gate.release(failed)
    assert gate.expected("k7") == 32 * GIB
    first.peak_rss, first.peak_files, first.phase = 6 * GIB, 12 * GIB, "timing"
    assert gate.expected("k7") == 18 * GIB  # measured past loading: its own from here
    assert gate.expected("k9") == 18 * GIB  # nothing of its own: the largest candidate's
    gate.release(first)
    assert gate.expected("k7") == 18 * GIB
    # a small task's first candidates: at its own reference, not a large task's candidates
    gate.admit(Child(last_rss_bytes=GIB, peak_rss=GIB, phase="idle"), "k3", "reference",
               limit_s=0)
    assert gate.expected("k3") == GIB


def test_held_files_count_a_child_s_own_files_in_memory_only(tmp_path: Path) -> None:
    from pike.evaluate import held_files

    shm = Path("/dev/shm")
    if not held_files.in_memory(shm):
        pytest.skip("no tmpfs at /dev/shm on this host")
    root = Path(tempfile.mkdtemp(prefix="pike-ref-test-", dir=shm))
    try:
        for name in ("work", "inputs", "expected"):
            (root / name).mkdir()
        (root / "inputs" / "inputs_0.pt").write_bytes(b"x" * 3 * 2**20)
        (root / "expected" / "outputs_0.pt").write_bytes(b"y" * 5 * 2**20)
        assert 8 * 2**20 <= held_files.held_bytes(root / "work") < 9 * 2**20
        # a file of two names (a candidate's view of the inputs) is its owner's to count
        os.link(root / "inputs" / "inputs_0.pt", root / "work" / "inputs_0.pt")
        assert 5 * 2**20 <= held_files.held_bytes(root / "work") < 6 * 2**20
        # a work folder outside a pike folder is the child's whole folder
        assert held_files.evaluation_folder(shm / "work") == shm / "work"
    finally:
        shutil.rmtree(root)
    disk = tmp_path / "pike-ref-ondisk"
    (disk / "work").mkdir(parents=True)
    (disk / "big.pt").write_bytes(b"z" * 2**20)
    assert held_files.held_bytes(disk / "work") == (
        2**20 if held_files.in_memory(tmp_path) else 0)


def test_a_kept_reference_building_a_baseline_is_counted_at_its_own_peak() -> None:
    """A baseline's builds run on a reference that has loaded: its expected outputs, mapped
    and out of its folder, are not expected again, and it is no new footprint."""
    host = Host(available=60 * GIB)
    gate = _gate(host)
    kept = Child(last_rss_bytes=8 * GIB, peak_rss=8 * GIB, last_files_bytes=0,
                 peak_files=56 * GIB, phase="build")
    gate.admit(kept, "k7", "reference")
    assert gate._coming(kept, "k7", "reference") == 0
    assert gate._fits("k2", "reference") is False  # expected at k7's 64 GiB: no room
    host.available = 100 * GIB
    assert gate._fits("k2", "reference")  # not held back as if k7 were still loading


def test_a_task_whose_kept_reference_was_closed_waits_as_before() -> None:
    """Its reference closed between two evaluations (an idle one is closed for a waiting
    child), the task is measured: its next reference waits the gate's usual time."""
    host = Host(available=10 * GIB)
    gate = _gate(host, longest_wait_s=0.0, new_task_wait_s=3.0)
    closed = Child(last_rss_bytes=30 * GIB, peak_rss=30 * GIB, phase="idle")
    gate.admit(closed, "k7", "reference")
    gate.release(closed)
    gate.admit(Child(last_rss_bytes=30 * GIB, peak_rss=30 * GIB, phase="idle"), "k9",
               "reference")
    assert gate.admit(Child(), "k7", "reference") < 1  # not the new task's hour


def test_a_confirming_window_s_candidate_counts_its_own_folder(tmp_path: Path) -> None:
    from pike.evaluate.held_files import evaluation_folder

    window = tmp_path / "pike-cand-1-t2-x"
    assert evaluation_folder(window / "c3" / "work") == window / "c3"
    assert evaluation_folder(window / "work") == window


def test_a_size_recalled_from_a_resumed_run_is_the_task_s_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A level1 bench spans device calls: in each new one a task not yet measured there
    was expected at the largest size measured, and a 3 GiB task waited behind 7's 63 GiB.
    The store keeps each task's size and the resumed run's gate starts from it; the task
    is still new here (its reference waits for the running ones, not 5 minutes only)."""
    from pike.search import campaign
    from pike.store import FOOTPRINT_STATE, RunStore
    from pike.task import Task

    host = Host(available=20 * GIB)
    gate = _gate(host)
    monkeypatch.setattr(host_memory, "HOST", gate)
    small = Task.from_file(Path(__file__).parents[1] / "examples" / "tasks" / "1_GeluMLP.py")
    with RunStore.create(tmp_path / "run", {}, "pike bench") as store:
        store.add_task(small.name, str(small.path), small.sha256, small.source)
        store.set_state(small.name, FOOTPRINT_STATE, {"reference": 3 * GIB, "candidate": GIB,
                                                      "other": 5, "junk": "x"})
        campaign._recall_footprints(store, [small])
    gate.admit(Child(last_rss_bytes=63 * GIB, peak_rss=63 * GIB, phase="idle"), "k7",
               "reference")
    assert gate.expected(small.sha256, "reference") == 3 * GIB
    assert gate.expected(small.sha256, "candidate") == GIB
    assert gate.admit(Child(), small.sha256, "reference") == 0.0 and host.sleeps == 0
    assert gate.measured(small.sha256, "reference") == 3 * GIB
    assert gate.measured("never", "reference") is None
    # recalled, yet new to this run: its reference waits for the running ones
    recalled = _gate(Host(available=20 * GIB))
    recalled.remember("k9", "reference", 63 * GIB)
    assert recalled._new_task("k9")


def _measured(gate: HostMemory, task: str, structural: int, took: int) -> None:
    """`task`'s reference answered `structural` bytes, then took `took` on the host."""
    gate.sized(task, structural)
    child = Child(peak_rss=took)
    gate.admit(child, task, "reference")
    gate.release(child)


def test_a_new_task_s_reference_is_expected_at_its_own_size_plus_the_host_s_part() -> None:
    """On the H100's level1 bench every new task's reference was expected at 42's 50.9 GiB,
    and a 10 GiB matmul's waited 300 s. A task that answered its size is expected at its
    structural bytes plus the most a measured task took beyond its own."""
    gate = _gate(Host(available=100 * GIB))
    _measured(gate, "k42", 44 * GIB, 51 * GIB)  # 7 GiB beyond its own
    _measured(gate, "k8", 4 * GIB, 12 * GIB)  # 8 GiB beyond
    assert gate.expected("unsized", "reference") == 51 * GIB  # no answer: as before
    gate.sized("k95", 1 * GIB)
    assert gate.expected("k95", "reference") == 9 * GIB
    gate.sized("k9", 60 * GIB)  # larger than any measured: its own size says so
    assert gate.expected("k9", "reference") == 68 * GIB
    gate.sized("none", None)  # asked, no answer: the largest, and not asked again
    assert gate.expected("none", "reference") == 51 * GIB and not gate.wants_size("none")
    assert gate.wants_size("k1") and not gate.wants_size("k42")  # sized already
    gate.remember("recalled", "reference", 20 * GIB)  # measured in an earlier call, not sized
    assert gate.wants_size("recalled")


def test_a_size_without_a_measured_task_beside_it_is_no_estimate() -> None:
    gate = _gate(Host(available=100 * GIB))
    unsized = Child(peak_rss=30 * GIB)  # measured, but its size unknown: no host's part
    gate.admit(unsized, "old", "reference")
    gate.release(unsized)
    gate.sized("new", GIB)
    assert gate.expected("new", "reference") == 30 * GIB
    # a task that took less than its structural bytes (weights built on the GPU, its
    # files on disk) says nothing of the host's part: still the largest
    _measured(gate, "gpu_built", 20 * GIB, 15 * GIB)
    assert gate.expected("new", "reference") == 30 * GIB
    _measured(gate, "measured", 2 * GIB, 6 * GIB)  # one that shows it: 4 GiB
    assert gate.expected("new", "reference") == 5 * GIB


def test_a_sized_new_task_does_not_wait_for_another_new_footprint() -> None:
    host = Host(available=120 * GIB)
    gate = _gate(host)
    gate.sized("k7", 32 * GIB)
    gate.sized("k9", 30 * GIB)
    gate.admit(Child(last_rss_bytes=GIB, peak_rss=GIB, phase="check"), "k7", "reference")
    # sized, but no host's part learned yet: one new footprint at a time, as before
    assert not gate._fits("k9", "reference")
    gate.sized("k2", 3 * GIB)  # measured before (a resumed run's store): 7 GiB beyond
    gate.remember("k2", "reference", 10 * GIB)
    assert not gate._fits("k3", "reference")  # unsized: waits for k7's to be measured
    # k9: 37 expected beside k7's 39 (less its 1 held): fits
    assert gate.admit(Child(), "k9", "reference", limit_s=60) == 0.0 and host.sleeps == 0


def test_a_task_s_size_is_kept_with_its_footprint_for_a_resumed_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pike.search import campaign
    from pike.store import FOOTPRINT_STATE, RunStore

    gate = _gate(Host(available=100 * GIB))
    monkeypatch.setattr(host_memory, "HOST", gate)
    small = Task.from_file(Path(__file__).parents[1] / "examples" / "tasks" / "1_GeluMLP.py")
    _measured(gate, small.sha256, 2 * GIB, 9 * GIB)
    with RunStore.create(tmp_path / "run", {}, "pike bench") as store:
        store.add_task(small.name, str(small.path), small.sha256, small.source)
        campaign._keep_footprint(store, small)
        kept = store.get_state(small.name, FOOTPRINT_STATE)
        assert kept == {"reference": 9 * GIB, "task_bytes": 2 * GIB}
        resumed = _gate(Host(available=100 * GIB))
        monkeypatch.setattr(host_memory, "HOST", resumed)
        campaign._recall_footprints(store, [small])
    resumed.sized("new", GIB)
    assert resumed.expected("new", "reference") == 8 * GIB
    assert resumed.structural(small.sha256) == 2 * GIB


def test_a_real_reference_answers_its_size_and_a_late_answer_is_dropped(
        mlp_task: Task, fast_config: EvalConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    """The child answers on the pipe before its request: the gate gets the task's
    structural bytes. Where the answer comes after the parent stopped waiting, the
    evaluation goes on and the answer is passed over when it comes."""
    from pike.evaluate import child_launch, task_size
    from pike.evaluate.held_files import in_memory
    from pike.evaluate.leftovers import scratch_root

    # on the CPU the timed sets' inputs are held twice (files and the rotation's tensors)
    expected = task_size.structural_for(task_size.on_meta(str(mlp_task.path)),
                                        fast_config.trials, fast_config.timing.input_sets,
                                        in_memory(scratch_root()), on_cpu=True)
    gate = HostMemory()
    monkeypatch.setattr(host_memory, "HOST", gate)
    source = mlp_task.source.replace("class Model", "class ModelNew") + \
        "\nclass Model(ModelNew):\n    pass\n"
    verdict = evaluate(mlp_task, source, fast_config)
    close_references()
    assert verdict.status in ("ok", "rejected"), verdict.message
    assert gate.structural(mlp_task.sha256) == expected and expected
    late = HostMemory()
    monkeypatch.setattr(host_memory, "HOST", late)
    monkeypatch.setattr(child_launch, "_ASK_SLACK_S", -task_size.SIZE_SECONDS)
    verdict = evaluate(mlp_task, source, fast_config)
    close_references()
    assert verdict.status in ("ok", "rejected"), verdict.message
    assert mlp_task.sha256 in late._structural and late.structural(mlp_task.sha256) is None


def test_a_confirming_window_takes_as_many_candidates_as_fit_beside_its_reference() -> None:
    """H100 level1, 7_Matmul_with_small_K: a 38 GB reference and 27 GB candidates, and a
    window of them begun at once, was killed by the host's OOM killer twice."""
    host = Host(100 * GIB)
    gate = _gate(host)
    assert gate.room_for("new", 4) == 4  # never measured: nothing to go by
    gate.remember("t", "reference", 38 * GIB)
    gate.remember("t", "candidate", 27 * GIB)
    assert gate.room_for("t", 4) == 2  # (100 - 2 - 38) // 27
    other = Child(last_rss_bytes=20 * GIB, peak_rss=50 * GIB, phase="timing")
    gate.admit(other, "other", "candidate", 0)  # its peak may come back: counted
    assert gate.room_for("t", 4) == 1
    host.available = 10 * GIB
    assert gate.room_for("t", 4) == 1  # at least the best: it ran alone in its search
    assert gate.room_for("t", 1) == 1


def test_the_confirming_window_keeps_the_best_and_the_fastest_mode_where_few_fit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from pike.search import confirm_best
    task = SimpleNamespace(name="t", sha256="t")
    mode = "compile:default"
    top = [SimpleNamespace(id=i, role="offline", idea=f"idea{i}") for i in (5, 6, 7)]
    top.append(SimpleNamespace(id=9, role="offline", idea=mode))  # joined for the mode
    for room, ids in ((4, [5, 6, 7, 9]), (3, [5, 6, 9]), (2, [5, 9]), (1, [5])):
        monkeypatch.setattr(host_memory.HOST, "room_for", lambda _t, _n, room=room: room)
        assert [r.id for r in confirm_best._as_many_as_fit(task, top, mode)] == ids
    # where the mode ranked among the best, the window is the best ones by rank
    top = [top[0], top[3], top[1], top[2]]
    monkeypatch.setattr(host_memory.HOST, "room_for", lambda _t, _n: 2)
    assert [r.id for r in confirm_best._as_many_as_fit(task, top, mode)] == [5, 9]
    assert [r.id for r in confirm_best._as_many_as_fit(task, top, None)] == [5, 9]
    monkeypatch.setattr(host_memory.HOST, "room_for", lambda _t, _n: 3)
    assert [r.id for r in confirm_best._as_many_as_fit(task, top, mode)] == [5, 9, 6]
