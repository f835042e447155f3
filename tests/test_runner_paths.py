"""Paths the evaluation child works out the way torch does."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from pike.evaluate.runner import inductor_temp_dir


@pytest.mark.parametrize("user", ["root", "a:b/c*d", "plain"])
def test_inductors_temp_dir_is_where_torch_puts_its_precompiled_headers(
        user: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # pike links this folder into the shared build cache; if torch moved it, the link
    # would quietly stop saving the header's build
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("LOGNAME", user)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert inductor_temp_dir() == Path(default_cache_dir())


def test_the_child_starts_without_a_warning_in_every_failure_message() -> None:
    # The child runs as `python -m pike.evaluate.runner`; where importing the package
    # had already imported the runner, runpy warned on stderr, and those lines filled the
    # 300 characters a confirming window keeps of a failure before its error.
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "pike.evaluate.runner"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0  # no request given
    assert "RuntimeWarning" not in done.stderr, done.stderr[:500]


def test_each_compile_mode_gets_its_own_copy_of_the_module() -> None:
    import torch

    from pike.evaluate.compiled_modes import own_copy

    model = torch.nn.Linear(3, 2)
    model.hidden = torch.zeros(2)  # state a forward may write
    copied, note = own_copy(model)
    assert copied is not model and copied.hidden is not model.hidden and note is None
    assert torch.equal(copied.weight, model.weight)
    copied.hidden.add_(1)
    assert model.hidden.sum() == 0

    class Uncopyable(torch.nn.Module):
        def __deepcopy__(self, memo: dict) -> None:
            raise RuntimeError("no copies of this one")

    shared = Uncopyable()
    kept, note = own_copy(shared)  # shared, as before, rather than no mode at all; said so
    assert kept is shared and note and "could not be copied: " in note
    assert "no copies of this one" in note


def test_a_module_too_big_for_a_copy_per_mode_is_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from pike.evaluate import compiled_modes

    model = torch.nn.Linear(1000, 1000, device="meta")  # 4 MB of weights, none allocated
    model.scale = torch.ones(1000, 1000, device="meta")  # a plain attribute counts too
    weights = sum(t.numel() * t.element_size() for t in compiled_modes._on_device(model))
    assert weights == (1000 * 1000 * 2 + 1000) * 4
    monkeypatch.setattr(compiled_modes, "_free_bytes", lambda device: 24 * 2**20)
    kept, note = compiled_modes.own_copy(model)  # over a quarter of what is free: shared
    assert kept is model and note and note.startswith("shares eager's module: its weights")
    monkeypatch.setattr(compiled_modes, "_free_bytes", lambda device: 100 * 2**20)
    copied, note = compiled_modes.own_copy(model)
    assert copied is not model and note is None
