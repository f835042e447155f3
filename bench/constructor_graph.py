"""What a task's model holds once built: with autograd on during its constructor, and under
torch.no_grad() as pike builds it (pike.evaluate.child_setup.construct).

    python bench/constructor_graph.py TASK.py [--set NAME=VALUE ...] [--device cpu]
        [--tag cpu-14] [--out bench/results]

A constructor that runs a forward and writes its results into buffers (level5's
14_llama2_decode: a prefill into its KV caches) leaves, built with autograd on, each
buffer a non-leaf tensor holding the forward's graph of saved tensors. Two measurements:

- each build in a fresh process of its own, at the size `--set` gives (module globals and
  their attributes, e.g. `--set model_args.dim=512 --set precomputed_seq_len=1024`; the
  full 14 does not fit a 24 GiB host): what the process grew by (RSS on the CPU; on a
  GPU, the memory allocated), and the model's own weights and buffers;
- the full size on the meta device (no memory): the saved tensors reachable from the
  model's buffers' graphs once built, each storage counted once, by shape, with the
  attention-weight-shaped ones (last two dimensions equal, the prefill's length) apart:
  the meta device's math attention saves them, a GPU's fused kernels do not.

The task runs in this process: only for the benchmark's own task files. Writes
bench/results/constructor-graph-TAG.md and .json (device, torch version, date, command).
"""

from __future__ import annotations

import argparse
import ast
import collections
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import torch
from common import RESULTS, device_name, now, this_command, with_ext

_GIB = 2**30


def _load(path: Path, settings: list[str]) -> dict[str, Any]:
    # a module of its own, registered: a task's dataclasses look their module up
    spec = importlib.util.spec_from_file_location("constructor_graph_task", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    ns = vars(module)
    for setting in settings:
        name, value = setting.split("=", 1)
        *owners, last = name.split(".")
        target: Any = ns
        for i, owner in enumerate(owners):
            target = target[owner] if i == 0 else getattr(target, owner)
        parsed = ast.literal_eval(value)
        if owners:
            setattr(target, last, parsed)
        else:
            target[last] = parsed
    return ns


def _own_bytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def build_once(task: Path, settings: list[str], device: str, no_grad: bool) -> dict[str, Any]:
    """One build in this (fresh) process: what it grew by, and the model's own bytes."""
    ns = _load(task, settings)
    torch.manual_seed(0)
    init = ns["get_init_inputs"]()
    on = torch.device(device)
    init = [x.to(on) if isinstance(x, torch.Tensor) else x for x in init]
    process = psutil.Process()
    before = torch.cuda.memory_allocated(on) if on.type == "cuda" else process.memory_info().rss
    with torch.device(on), torch.set_grad_enabled(not no_grad):
        model = ns["Model"](*init)
    if on.type == "cuda":
        torch.cuda.synchronize(on)
        torch.cuda.empty_cache()
        grew = torch.cuda.memory_allocated(on) - before
    else:
        grew = process.memory_info().rss - before
    graphs = sum(b.grad_fn is not None for b in model.buffers())
    return {"no_grad": no_grad, "grew_bytes": grew, "own_bytes": _own_bytes(model),
            "buffers_holding_a_graph": graphs}


def _saved_tensors(node: Any) -> list[torch.Tensor]:
    found = []
    for attr in dir(node):
        if not attr.startswith("_saved_"):
            continue
        try:
            value = getattr(node, attr)
        except RuntimeError:  # freed, or not unpackable
            continue
        values = value if isinstance(value, (tuple, list)) else [value]
        found += [v for v in values if isinstance(v, torch.Tensor)]
    return found


def meta_count(task: Path, settings: list[str]) -> dict[str, Any]:
    """The full-size build on the meta device, autograd on: what its buffers' graphs keep."""
    ns = _load(task, settings)
    init = [x.to("meta") if isinstance(x, torch.Tensor) else x for x in ns["get_init_inputs"]()]
    with torch.device("meta"):
        model = ns["Model"](*init)
    own = {t.untyped_storage()._cdata for t in [*model.parameters(), *model.buffers()]}
    kept: dict[int, tuple[int, tuple[int, ...]]] = {}
    seen, todo = set(), [b.grad_fn for b in model.buffers() if b.grad_fn is not None]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        for t in _saved_tensors(node):
            storage = t.untyped_storage()
            if storage._cdata not in own:
                kept[storage._cdata] = (storage.nbytes(), tuple(t.shape))
        todo += [next_node for next_node, _ in node.next_functions]
    by_shape: collections.Counter[tuple[int, ...]] = collections.Counter()
    for nbytes, shape in kept.values():
        by_shape[shape] += nbytes
    square = sum(n for s, n in by_shape.items() if len(s) >= 3 and s[-1] == s[-2] > 1)
    return {"own_bytes": _own_bytes(model), "kept_bytes": sum(by_shape.values()),
            "attention_shaped_bytes": square, "graph_nodes": len(seen),
            "by_shape": [{"shape": list(s), "bytes": n} for s, n in by_shape.most_common(10)]}


def _child(args: argparse.Namespace, no_grad: bool) -> dict[str, Any]:
    command = [sys.executable, __file__, str(args.task), "--device", args.device, "--one",
               "no_grad" if no_grad else "grad", *(f"--set={s}" for s in args.set)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _markdown(data: dict[str, Any]) -> str:
    gib = lambda n: f"{n / _GIB:.2f} GiB"  # noqa: E731
    lines = [f"# What a model holds once built: {data['task']}", "",
             f"- device: {data['device']}; torch {data['torch']}; {data['date']}",
             f"- command: `{data['command']}`", "",
             f"## Built in a fresh process each, at the size set ({', '.join(data['set']) or 'as written'})",
             "", "| constructor ran | process grew by | model's own weights and buffers "
             "| buffers holding a graph |", "| --- | --- | --- | --- |"]
    for row in data["builds"]:
        mode = "under torch.no_grad() (as pike builds)" if row["no_grad"] else "with autograd on"
        lines.append(f"| {mode} | {gib(row['grew_bytes'])} | {gib(row['own_bytes'])} "
                     f"| {row['buffers_holding_a_graph']} |")
    meta = data["meta"]
    lines += ["", "## Full size on the meta device, autograd on", "",
              f"- the model's own weights and buffers: {gib(meta['own_bytes'])}",
              f"- saved tensors its buffers' graphs keep (each storage once): "
              f"{gib(meta['kept_bytes'])}, of them attention-weight-shaped "
              f"{gib(meta['attention_shaped_bytes'])} (the math attention's, which a GPU's "
              f"fused kernels do not save); the rest {gib(meta['kept_bytes'] - meta['attention_shaped_bytes'])}",
              f"- graph nodes reached: {meta['graph_nodes']}", "",
              "| shape | kept |", "| --- | --- |"]
    lines += [f"| {tuple(r['shape'])} | {gib(r['bytes'])} |" for r in meta["by_shape"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("task", type=Path)
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="a module global or its attribute, for the measured builds")
    p.add_argument("--device", default="cpu")
    p.add_argument("--tag", default="cpu")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--one", choices=["grad", "no_grad"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(build_once(args.task, args.set, args.device, args.one == "no_grad")))
        return 0
    data = {"task": args.task.name, "device": device_name(args.device),
            "torch": torch.__version__, "date": now(), "command": this_command(),
            "set": args.set, "builds": [_child(args, False), _child(args, True)],
            "meta": meta_count(args.task, [])}
    stem = args.out / f"constructor-graph-{args.tag}"
    with_ext(stem, ".json").write_text(json.dumps(data, indent=2) + "\n")
    with_ext(stem, ".md").write_text(_markdown(data))
    print(_markdown(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
