"""MIG profiles per GPU model (data: ``data/mig-profiles.yaml``, from NVIDIA's MIG user guide: the sources are there).

A profile ``Ng.Mgb`` has N compute slices (of 7; of 4 on A30 and RTX PRO 6000) and a nominal memory of M GB, cut in
eighths of the GPU's memory. The table says, per model, each profile's slices, nominal GB, memory eighths, instances
per GPU and usable MiB where known. Nodes name profiles their own way (``7g.79gb`` for ``7g.80gb``, ``1g.10gb.me``
for the media-extension variant): :meth:`GpuModel.lookup` matches such a name to its row; :func:`derive` reads the
facts off the name for a GPU the table does not know.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

from webhook.errors import ConfigError

_NAME = re.compile(r"^(\d+)g\.(\d+)gb(.*)\Z")
# Typical memory eighths by compute slices on a 7-slice GPU (1g comes in a 1/8 and a 2/8 size).
_EIGHTHS_BY_SLICES_7 = {1: 1, 2: 2, 3: 4, 4: 4, 7: 8}
_EIGHTHS_BY_SLICES_4 = {1: 2, 2: 4, 4: 8}


@dataclass(frozen=True)
class Profile:
    """One MIG profile of one GPU model."""

    name: str
    """As the table (or the node, for a derived profile) names it, e.g. 3g.40gb."""
    slices: int
    """Compute slices."""
    total_slices: int
    """Compute slices of the whole GPU (7, or 4)."""
    gb: int
    """Nominal memory (the name's GB, or the table row's when a driver names it differently)."""
    eighths: int
    """Share of the GPU's memory, in eighths."""
    max_instances: int = 0
    usable_mib: int = 0
    """Usable memory in MiB where known (0: unknown)."""
    derived: bool = False
    """True when read off the name rather than found in the table."""

    @property
    def memory_share(self) -> str:
        return f"{self.eighths}/8"

    @property
    def compute_share(self) -> str:
        return f"{self.slices}/{self.total_slices}"


@dataclass(frozen=True)
class GpuModel:
    name: str
    products: tuple[re.Pattern[str], ...]
    gke_accelerators: tuple[str, ...]
    memory_gb: int
    compute_slices: int
    profiles: Mapping[str, Profile]
    aliases: Mapping[str, str]
    """Other names of a profile (7g.79gb -> 7g.80gb)."""

    def matches(self, product: str) -> bool:
        return any(p.search(product) for p in self.products)

    def lookup(self, name: str) -> Profile | None:
        """The table row for a profile as a node names it: exact, alias, variant (``.me``, ``+me``, ``+gfx``), or
        same compute slices and the nearest nominal size within 10 %."""
        parsed = parse_name(name)
        if parsed is None:
            return None
        slices, gb, _variant = parsed
        base = f"{slices}g.{gb}gb"
        row = self.profiles.get(base) or self.profiles.get(self.aliases.get(base, ""))
        if row is None:
            near = [p for p in self.profiles.values() if p.slices == slices and abs(p.gb - gb) * 10 <= p.gb]
            near.sort(key=lambda p: (abs(p.gb - gb), p.gb))
            row = near[0] if near else None
        if row is None:
            return None
        return Profile(name, row.slices, row.total_slices, row.gb, row.eighths, row.max_instances, row.usable_mib)


def parse_name(name: str) -> tuple[int, int, str] | None:
    """'3g.40gb' -> (3, 40, ''); '1g.10gb.me' -> (1, 10, '.me'); anything else -> None."""
    match = _NAME.match(name)
    if not match:
        return None
    slices, gb = int(match.group(1)), int(match.group(2))
    if slices <= 0 or gb <= 0:
        return None
    return slices, gb, match.group(3)


def derive(name: str, full_gb: float = 0, total_slices: int = 0) -> Profile | None:
    """A profile read off its name for a GPU the table does not know.

    The memory share is the name's GB over the GPU's memory (``full_gb``, from the node's ``nvidia.com/gpu.memory``)
    rounded to eighths; without the GPU's memory it is the typical share for the compute slices.
    """
    parsed = parse_name(name)
    if parsed is None:
        return None
    slices, gb, _ = parsed
    total = total_slices or 7
    if slices > total:
        return None
    if full_gb > 0:
        eighths = round(gb * 8 / full_gb)
    else:
        table = _EIGHTHS_BY_SLICES_4 if total == 4 else _EIGHTHS_BY_SLICES_7
        if slices not in table:
            return None
        eighths = table[slices]
    eighths = max(1, min(8, eighths))
    return Profile(name, slices, total, gb, eighths, derived=True)


@dataclass(frozen=True)
class ProfileTable:
    models: tuple[GpuModel, ...]

    def model_for(
        self, product: str = "", accelerator: str = "", memory_mib: int = 0, offered: Iterable[str] = ()
    ) -> GpuModel | None:
        """The model of a GPU from its GFD product name (nearest memory when several match; without the memory
        (single strategy), the one whose table names every offered profile), its GKE accelerator label, or, failing
        both, the one model whose table names every offered profile."""
        found = [m for m in self.models if product and m.matches(product)]
        if not found and accelerator:
            found = [m for m in self.models if accelerator in m.gke_accelerators]
        if len(found) > 1 and memory_mib > 0:
            gib = memory_mib / 1024
            found.sort(key=lambda m: abs(m.memory_gb - gib))
            return found[0]
        names = [n for n in offered if parse_name(n)]
        if len(found) > 1 and names:  # GH200 is a 96 GB and a 144 GB part: 1g.18gb is only the second's
            naming = [m for m in found if _names_all(m, names)]
            if naming:
                return naming[0]
        if found:
            return found[0]
        if names:
            fitting = [m for m in self.models if _names_all(m, names)]
            if len(fitting) == 1 or (fitting and all(_same_rows(fitting[0], m) for m in fitting[1:])):
                return fitting[0]
        return None


def _names_all(model: GpuModel, names: Iterable[str]) -> bool:
    """``model``'s table has each of these profiles, by its own name."""
    return all(model.lookup(n) is not None and _exact(model, n) for n in names)


def _exact(model: GpuModel, name: str) -> bool:
    parsed = parse_name(name)
    if parsed is None:
        return False
    base = f"{parsed[0]}g.{parsed[1]}gb"
    return base in model.profiles or base in model.aliases


def _same_rows(a: GpuModel, b: GpuModel) -> bool:
    return {(p.name, p.eighths, p.slices) for p in a.profiles.values()} == {
        (p.name, p.eighths, p.slices) for p in b.profiles.values()
    }


def _int(value: Any, where: str, low: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ConfigError(f"mig-profiles.yaml: {where}: must be an integer >= {low} (got {value!r})")
    return value


def _model(name: str, raw: Any) -> GpuModel:
    if not isinstance(raw, dict):
        raise ConfigError(f"mig-profiles.yaml: {name}: must be a mapping")
    total = _int(raw.get("compute_slices"), f"{name}.compute_slices", 1)
    profiles: dict[str, Profile] = {}
    aliases: dict[str, str] = {}
    for pname, row in (raw.get("profiles") or {}).items():
        where = f"{name}.profiles.{pname}"
        if not isinstance(row, dict):
            raise ConfigError(f"mig-profiles.yaml: {where}: must be a mapping")
        parsed = parse_name(str(pname))
        slices = _int(row.get("slices"), f"{where}.slices", 1)
        gb = _int(row.get("gb"), f"{where}.gb", 1)
        eighths = _int(row.get("eighths"), f"{where}.eighths", 1)
        if parsed is None or parsed[:2] != (slices, gb) or slices > total or eighths > 8:
            raise ConfigError(f"mig-profiles.yaml: {where}: slices/gb/eighths disagree with the name")
        profiles[str(pname)] = Profile(
            str(pname),
            slices,
            total,
            gb,
            eighths,
            _int(row.get("max", 0), f"{where}.max"),
            _int(row.get("usable_mib", 0), f"{where}.usable_mib"),
        )
        for alias in row.get("aliases") or ():
            aliases[str(alias)] = str(pname)
    return GpuModel(
        name=name,
        products=tuple(re.compile(str(p), re.IGNORECASE) for p in raw.get("products") or ()),
        gke_accelerators=tuple(str(a) for a in raw.get("gke_accelerators") or ()),
        memory_gb=_int(raw.get("memory_gb"), f"{name}.memory_gb", 1),
        compute_slices=total,
        profiles=profiles,
        aliases=aliases,
    )


@lru_cache(maxsize=1)
def load_table() -> ProfileTable:
    """The built-in table, parsed and checked once."""
    text = resources.files("webhook.data").joinpath("mig-profiles.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(models, dict):
        raise ConfigError("mig-profiles.yaml: must hold a mapping 'models'")
    return ProfileTable(tuple(_model(str(n), raw) for n, raw in models.items()))
