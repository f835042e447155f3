"""bench/adversarial.py --combine: the parts of a run cut by a device call's limit, joined
into one page in the classes' order, judging nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _part(path: Path, rows: list[tuple[str, bool]], torch_version: str = "2.11.0") -> Path:
    path.write_text(json.dumps({
        "benchmark": "adversarial", "device": "cuda", "device_name": "H100",
        "torch_version": torch_version, "sandbox": "bubblewrap", "date": path.stem,
        "command": f"python bench/adversarial.py --only {path.stem}",
        "rows": [{"class": "c", "candidate": name, "status": "rejected", "message": "m",
                  "defended": defended} for name, defended in rows]}))
    return path


def _combine(tmp_path: Path, *parts: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "bench" / "adversarial.py"), "--combine",
                           *map(str, parts), "--out", str(tmp_path), "--name", "joined",
                           "--note", "pike at abc"], capture_output=True, text=True,
                          timeout=120)


def test_parts_join_in_the_classes_order_and_each_command_is_quoted(tmp_path: Path) -> None:
    # the second part holds an earlier class's candidate: the page keeps the classes' order
    first = _part(tmp_path / "first.json", [("wraps_channel", True)])
    second = _part(tmp_path / "second.json", [("stale_by_frames", True),
                                              ("nests_folders_deep", True)])
    done = _combine(tmp_path, first, second)
    assert done.returncode == 1, done.stderr  # the page is written; the rest were not judged
    page = (tmp_path / "joined.md").read_text()
    assert "3 of 3 defended" in page and "- note: pike at abc" in page
    assert "--only first" in page and "--only second" in page
    rows = [line.split(" | ")[1] for line in page.splitlines() if line.startswith("| c |")]
    assert rows == ["stale_by_frames", "wraps_channel", "nests_folders_deep"]
    assert "not judged in any part" in done.stdout  # the rest of the 63 are named


def test_a_part_not_defended_fails_and_parts_of_two_torches_are_refused(tmp_path: Path) -> None:
    lost = _part(tmp_path / "lost.json", [("wraps_channel", False)])
    assert _combine(tmp_path, lost).returncode == 1
    assert "**no**" in (tmp_path / "joined.md").read_text()
    other = _part(tmp_path / "other.json", [("walks_gc", True)], torch_version="2.13.0")
    refused = _combine(tmp_path, lost, other)
    assert refused.returncode != 0 and "different devices or torch" in refused.stderr
