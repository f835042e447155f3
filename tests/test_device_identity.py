"""The physical device behind a measurement (evaluate/device_identity.py)."""

from __future__ import annotations

import subprocess

import pytest
import torch

from pike.evaluate import device_identity
from pike.evaluate.device_identity import identity, probe


def test_a_cpu_is_known_by_its_hosts_boot_and_the_same_from_any_process() -> None:
    here = identity("cpu")
    assert here.startswith("cpu-") and len(here) > len("cpu-")
    assert probe("cpu") == here == identity("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a host without CUDA")
def test_a_gpu_that_cannot_be_told_is_unknown_and_never_matches() -> None:
    assert identity("cuda:0") == ""
    assert probe("cuda:0") == ""  # the probe's own process finds no card either


def test_a_probe_that_hangs_or_cannot_start_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    def hangs(*args: object, **kwargs: object) -> None:
        raise subprocess.TimeoutExpired(cmd="python", timeout=1)

    monkeypatch.setattr(device_identity.subprocess, "run", hangs)
    assert probe("cuda:3") == ""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_gpu_is_known_by_its_uuid_in_the_child_and_in_the_probe() -> None:
    count = torch.cuda.device_count()
    found = [probe(f"cuda:{i}") for i in range(count)]
    assert all(f.startswith("GPU-") for f in found) and len(set(found)) == count
