"""NVIDIA driver versions and the newest CUDA each supports (data: ``data/cuda-driver.yaml``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import yaml

Version = tuple[int, ...]
_VERSION = re.compile(r"^[0-9]+(?:\.[0-9]+){0,3}\Z")


def parse_version(text: object) -> Version | None:
    """'570.124.06' -> (570, 124, 6); parts compare as numbers ('06' is not octal). None when not a version."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        text = str(text)
    if not isinstance(text, str):
        return None
    text = text.strip()
    if len(text) > 40 or not _VERSION.match(text):
        return None
    return tuple(int(p) for p in text.split("."))


def show(version: Version) -> str:
    return ".".join(str(p) for p in version)


def show_driver(version: Version | None) -> str:
    """A driver version in NVIDIA's spelling: the third part has two digits (535.104.05; 570.26 has none)."""
    if version is None:
        return "unknown"
    if len(version) == 3:
        return f"{version[0]}.{version[1]}.{version[2]:02d}"
    return show(version)


@dataclass(frozen=True)
class DriverTable:
    """CUDA minor -> minimum driver (GA rows) and minor-compat floors."""

    minimum: tuple[tuple[Version, Version], ...]
    """(cuda major.minor, minimum driver), newest CUDA first."""
    minor_floor: Mapping[int, Version]
    source: str

    def cuda_for_driver(self, driver: Version) -> Version | None:
        """The newest CUDA major.minor this driver supports; None when older than every row."""
        for cuda, need in self.minimum:
            if driver >= need:
                return cuda
        return None

    def minimum_driver(self, cuda: Version) -> Version | None:
        """The oldest driver that supports CUDA ``cuda`` (major.minor); None for a release the table does not know
        (a newer one needs a newer driver than any row)."""
        for row, need in self.minimum:
            if row == cuda[:2]:
                return need
        return None

    def with_rows(self, extra: Mapping[str, str]) -> DriverTable:
        rows = dict(self.minimum)
        for cuda, driver in extra.items():
            c, d = parse_version(cuda), parse_version(driver)
            if c is None or d is None:
                raise ValueError(f"cuda.driverTable: {cuda!r}: {driver!r} is not a CUDA version and a driver version")
            rows[c[:2]] = d
        ordered = tuple(sorted(rows.items(), reverse=True))
        return DriverTable(ordered, self.minor_floor, self.source)


@lru_cache(maxsize=1)
def builtin_table() -> DriverTable:
    raw = yaml.safe_load(resources.files("webhook.data").joinpath("cuda-driver.yaml").read_text(encoding="utf-8"))
    rows = []
    for cuda, driver in raw["minimum_driver"].items():
        c, d = parse_version(cuda), parse_version(driver)
        assert c is not None and d is not None, (cuda, driver)
        rows.append((c, d))
    floors = {}
    for major, driver in raw["minor_compat_floor"].items():
        d = parse_version(driver)
        assert d is not None
        floors[int(major)] = d
    return DriverTable(
        tuple(sorted(rows, reverse=True)),
        floors,
        str(raw["source"]),
    )
