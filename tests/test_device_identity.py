"""The physical device behind a measurement (evaluate/device_identity.py)."""

from __future__ import annotations

import time

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
    monkeypatch.setattr(device_identity.sys, "executable", "/no/such/python")
    assert probe("cuda:3") == ""
    monkeypatch.undo()
    monkeypatch.setattr(device_identity, "_probe_code", lambda: "import time; time.sleep(60)")
    started = time.monotonic()
    assert probe("cuda:3", timeout=1.0) == ""
    assert time.monotonic() - started < 10


def test_only_a_cpu_or_a_cuda_device_has_an_identity() -> None:
    assert identity("mps") == identity("xpu:1") == ""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_gpu_is_known_by_its_uuid_in_the_child_and_in_the_probe() -> None:
    count = torch.cuda.device_count()
    found = [probe(f"cuda:{i}") for i in range(count)]
    assert all(f.startswith("GPU-") for f in found) and len(set(found)) == count
