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
