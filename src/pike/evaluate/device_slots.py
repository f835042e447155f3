"""Work spread over the GPUs of `eval.devices`, one piece on one GPU: an audited task's
baselines and file, a campaign task's baselines. Each piece's figures then come from one
card, and the device lock (per physical GPU) keeps two pieces on one GPU from timing at
once."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from pike.config import RunConfig


class DeviceSlots:
    """The GPUs of a config's `eval.devices`; with none, everything runs on `eval.device`."""

    def __init__(self, cfg: RunConfig, at_once: int = 1, beside_others: bool = False) -> None:
        """`beside_others`: other work (a campaign's searches) shares the GPUs with these
        pieces, so a piece's device-alone build stops it even with a GPU to itself."""
        self._cfg = cfg
        self._beside_others = beside_others
        # "cuda" and "cuda:0" are one GPU: two slots on it would not be one task per GPU
        self.devices = list(dict.fromkeys("cuda:0" if d == "cuda" else d
                                          for d in cfg.eval.devices))
        self._busy = dict.fromkeys(self.devices, 0)
        self._lock = threading.Lock()
        # Fewer pieces at once than GPUs would leave GPUs idle.
        self.at_once = max(at_once, len(self.devices))

    @property
    def locked(self) -> bool:
        """Whether every piece runs on a GPU whose device lock keeps each timing window
        alone from all other work. The CPU holds no lock, and `eval.device_lock:
        timing_only` leaves builds and trials unstopped: there, work beside a piece is in
        its timings."""
        return self._cfg.eval.device_lock != "timing_only" and all(
            _on_gpu(d) for d in self.devices or [self._cfg.eval.device])

    def note(self, what: str) -> list[str]:
        """A line for a result that says how `what` was spread (none with one GPU)."""
        if len(self.devices) < 2:
            return []
        each = ("one at a time on each" if self.at_once == len(self.devices) else
                f"{self.at_once} at once, timing one at a time on each")
        return [f"{what} spread over {len(self.devices)} GPUs ({', '.join(self.devices)}), "
                f"{each}"]

    @contextmanager
    def take(self, prefer: str | None = None) -> Iterator[RunConfig]:
        """The config for one piece of work: on the least busy GPU, `prefer` where it is
        one of them (the card that measured part of it before), else the first."""
        if not self.devices:
            yield self._on(self._cfg.eval.device)
            return
        with self._lock:
            least = min(self._busy.values())
            device = (prefer if prefer is not None and self._busy.get(prefer) == least
                      else min(self._busy, key=lambda d: self._busy[d]))
            self._busy[device] += 1
        try:
            yield self._on(device)
        finally:
            with self._lock:
                self._busy[device] -= 1

    def _on(self, device: str) -> RunConfig:
        """The config of a piece on `device`, with `eval.prebuild_autotune: auto` settled:
        on where more pieces run at once than there are GPUs (a piece's device-alone build
        then stops the others) or other work shares them, off where each piece has its
        GPU to itself, and off on the CPU, which holds no device lock: nothing waits
        there, and a pre-build's compile only loads the cores another task is timed on."""
        update: dict[str, object] = {"device": device, "devices": []}
        if self._cfg.eval.prebuild_autotune == "auto":
            shared = _on_gpu(device) and (self._beside_others
                                          or self.at_once > max(1, len(self.devices)))
            update["prebuild_autotune"] = "on" if shared else "off"
        return self._cfg.model_copy(update={"eval": self._cfg.eval.model_copy(update=update)})


def _on_gpu(device: str | None) -> bool:
    # resolved here, not by judge.resolve_device, which raises on a host without CUDA
    return (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
