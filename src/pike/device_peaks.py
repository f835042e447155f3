"""The device entries the floor uses: each accelerator's dense peaks (FLOP/s) per
precision and its DRAM bandwidth (bytes/s), from pike/data/devices.yaml or a file of the
same form, and the entry a torch.cuda.get_device_name() string names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, ValidationError

from pike.errors import ConfigError

Precision = Literal["bf16", "fp16", "tf32", "fp32"]


class Device(BaseModel):
    """One accelerator's dense peaks (FLOP/s) and DRAM bandwidth (bytes/s), from devices.yaml."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    names: list[str] = Field(min_length=1, description="torch.cuda.get_device_name() strings")
    bf16: PositiveFloat
    fp16: PositiveFloat
    tf32: PositiveFloat
    fp32: PositiveFloat = Field(description="CUDA-core (non-tensor-core) fp32 peak")
    bandwidth: PositiveFloat
    source: str
    uncertain: list[str] = Field(description="fields whose figure is an estimate or a choice")

    def peak(self, precision: Precision) -> float:
        return float(getattr(self, precision))


def load_devices(path: str | Path | None = None) -> list[Device]:
    """The device entries of `path`, or of the devices.yaml shipped with pike."""
    if path is None:
        return list(_bundled_devices())
    return _parse_devices(Path(path).read_text(), str(path))


@lru_cache(maxsize=1)
def _bundled_devices() -> tuple[Device, ...]:
    text = resources.files("pike").joinpath("data/devices.yaml").read_text()
    return tuple(_parse_devices(text, "pike/data/devices.yaml"))


def _parse_devices(text: str, where: str) -> list[Device]:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{where}: not valid YAML ({str(err).splitlines()[0]})") from None
    entries = raw.get("devices") if isinstance(raw, dict) else None
    if not isinstance(entries, list):
        raise ConfigError(f"{where}: not a device file (wants a `devices:` list)")
    devices = []
    for i, entry in enumerate(entries):
        try:
            devices.append(Device.model_validate(entry))
        except ValidationError as err:
            first = err.errors()[0]
            name = entry.get("name", f"entry {i + 1}") if isinstance(entry, dict) else i + 1
            field = ".".join(map(str, first["loc"])) or "entry"
            raise ConfigError(f"{where}: {name}: {field}: {first['msg']}") from None
    seen: dict[str, str] = {}
    for device in devices:
        for name in [device.name, *device.names]:
            key = _normalize(name)
            if seen.setdefault(key, device.name) != device.name:
                raise ConfigError(f"{where}: {name!r} names both {seen[key]} and {device.name}")
    return devices


def _normalize(name: str) -> str:
    words = re.sub(r"[\s_\-]+", " ", name.strip().lower())
    return words.removeprefix("nvidia ").strip()


def match_device(device_name: str, devices: Iterable[Device] | None = None) -> Device | None:
    """The entry whose names include `device_name` (a torch.cuda.get_device_name() string)."""
    key = _normalize(device_name)
    for device in devices if devices is not None else _bundled_devices():
        if key in {_normalize(n) for n in [device.name, *device.names]}:
            return device
    return None
