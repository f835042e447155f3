"""How fast a trial's tensors cross between an evaluation's processes, by file format.

    python bench/transport.py [--mib 1024] [--repeats 3] [--tag h100] [--out bench/results]

One float32 tensor of --mib MiB on the device (cuda where present) goes through each step
an evaluation takes with it, through a file on the evaluation's scratch folder (/dev/shm
where it is large enough):

- `write`: the child writes its output (torch.save of a host copy, or pike's flat file);
- `read untrusted`: the parent reads a candidate's file whole, then moves it to the device
  in the comparison's chunks;
- `read trusted`: a reference file, mapped (torch.load mmap, or the flat file mapped),
  then moved to the device (a child's staged inputs; the parent's expected outputs).

Medians of --repeats, in seconds. Results go to bench/results/transport-<tag>.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from common import RESULTS, device_name, now, this_command

from pike.evaluate.check import COMPARE_CHUNK
from pike.evaluate.leaf_files import read_leaves, write_leaves
from pike.evaluate.leftovers import scratch_root


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _to_device_in_chunks(t: torch.Tensor, device: torch.device) -> float:
    flat, total = t.reshape(-1), 0.0
    for at in range(0, flat.numel(), COMPARE_CHUNK):
        total += float(flat[at:at + COMPARE_CHUNK].to(device).sum())
    return total


def measure(mib: int, repeats: int, device: torch.device, folder: Path) -> dict[str, dict]:
    t = torch.rand(mib << 18, device=device)  # mib MiB of float32
    _sync(device)
    path = folder / "leaves.pt"
    formats: dict[str, dict[str, Callable[[], object]]] = {
        "torch.save": {
            "write": lambda: torch.save([t.detach().to("cpu")], path),
            "read untrusted": lambda: _to_device_in_chunks(
                torch.load(path, weights_only=True)[0], device),
            "read trusted": lambda: torch.load(path, weights_only=True, mmap=True)[0]
            .to(device).sum().item(),
        },
        "flat": {
            "write": lambda: write_leaves([t], path),
            "read untrusted": lambda: _to_device_in_chunks(read_leaves(path)[0], device),
            "read trusted": lambda: read_leaves(path, trusted=True)[0].to(device).sum().item(),
        },
    }
    found: dict[str, dict] = {}
    for name, steps in formats.items():
        found[name] = {}
        for step, fn in steps.items():
            times = []
            for _ in range(repeats):
                started = time.perf_counter()
                fn()
                _sync(device)
                times.append(time.perf_counter() - started)
            found[name][step] = round(statistics.median(times), 4)
            print(f"{name:10s} {step:15s} {found[name][step]:.3f} s", flush=True)
        path.unlink()
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tag", default=None)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory(dir=scratch_root()) as tmp:
        found = measure(args.mib, args.repeats, device, Path(tmp))
        where = scratch_root()
    data = {"device": device_name(args.device), "torch": torch.__version__, "date": now(),
            "command": this_command(), "mib": args.mib, "repeats": args.repeats,
            "scratch": str(where), "seconds": found}
    name = "transport" + (f"-{args.tag}" if args.tag else "")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")
    steps = list(next(iter(found.values())))
    lines = [f"# Tensor transport between processes ({data['device']})", "",
             f"- device: {args.device}, torch {data['torch']}", f"- date: {data['date']}",
             f"- command: `{data['command']}`",
             f"- one float32 tensor of {args.mib} MiB through a file in {where}; "
             f"seconds, median of {args.repeats}", "",
             "| format | " + " | ".join(steps) + " |", "|---|" + "---|" * len(steps)]
    lines += [f"| {fmt} | " + " | ".join(f"{found[fmt][s]:.3f}" for s in steps) + " |"
              for fmt in found]
    (args.out / f"{name}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
