"""The CUDA a container needs, where that came from, and whether a node group satisfies it.

A container's requirement comes from, in order (the first that says anything wins):

1. the pod annotation ``gpu-admission.io/cuda-version.<container>``, then ``gpu-admission.io/cuda-version``
   (``cuda>=<major.minor>``; where the container sets none of 2.-4. and a rule of 5. reads its image at that
   version or above, with the forward compatibility the image's tag brings);
2. ``NVIDIA_DISABLE_REQUIRE`` (a Go boolean) set true in the container's env: the runtime checks none of the
   requirements below, so neither does the webhook (the container is "not checked");
3. ``NVIDIA_REQUIRE_CUDA`` in the container's env: a requirement expression (below);
4. ``CUDA_VERSION`` in the container's env: the runtime reads an image with it and no ``NVIDIA_REQUIRE_CUDA`` as
   ``cuda>=<major.minor>``;
5. the image reference, through the rules of ``data/cuda-images.yaml``;
6. with ``cuda.registry`` on, the image's config in its registry (``webhook.registry``): its env's
   ``NVIDIA_DISABLE_REQUIRE``, ``NVIDIA_REQUIRE_CUDA`` and ``CUDA_VERSION``, read as 2.-4. are, each under the
   container's own variable of that name (the runtime's merge). Read in the background: until it is, the version is
   unknown. Where the pod sets a variable of 3.-4. itself, a config already read still counts through the ones the
   runtime reads before it (the image's ``NVIDIA_REQUIRE_CUDA`` over the pod's ``CUDA_VERSION``; the image's
   ``NVIDIA_DISABLE_REQUIRE`` over both). An image a rule of 5. reads is not asked of its registry.

An nvidia/cuda image (and one its rule knows is built on it, ``sets_require_cuda`` in the data) sets
``NVIDIA_REQUIRE_CUDA`` in its own env: where the pod sets ``CUDA_VERSION`` and not that, the runtime reads the
image's, so its tag (5.) decides over the pod's ``CUDA_VERSION`` (4.), even one set by ``valueFrom``.

One of the variables of 2.-4. set by ``valueFrom`` (a ConfigMap, a Secret, a field of the pod) stops the lookup
there with the version unknown: the runtime reads its value, which the webhook cannot, and it overrides every later
source (the settings' ``unknownVersion`` decides; the annotation of 1. declares it). Values are read as the kubelet
hands them over, with ``$(NAME)`` references to earlier entries expanded; one that refers to a value the webhook
cannot read is unknown too. ``envFrom`` is not read: its ConfigMap or Secret could set these variables, but most
containers have one for settings of their own, and treating all of them as unknown would check almost none (the
annotation of 1. declares a container whose envFrom does set them).

The requirement expression is libnvidia-container's (``src/cli/dsl.c``): space-separated terms are ORed, the
comma-separated conditions of a term are ANDed; a condition is ``<key><op><value>`` with key ``cuda``, ``driver``,
``arch`` or ``brand`` (any case) and op one of ``= != < <= > >=``; versions compare numerically part by part
(trailing ``.0`` parts ignored), brands as strings without case and only with ``=`` / ``!=``. Anything else is an
invalid expression: an error, never a pass. Unlike the runtime, which stops at the first term that holds, the whole
expression is checked, so a bad term is reported whatever the node.

``cuda`` compares with the newest CUDA the node's driver supports, at major.minor (every 12.4.x image says
``cuda>=12.4``; a driver reports ``12.4``, whichever 550 build it is: see ``data/cuda-driver.yaml``). A bound written
with a patch release (``cuda>=12.4.1``) is read at major.minor too: the CUDA 12.4.1 runtime runs on any 12.4 driver,
although the legacy runtime's check (``dsl_compare_version`` against ``"12.4"``) refuses it on every one of them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any, Literal

import yaml

from webhook import PREFIX, budget
from webhook.cluster import GFD, GKE_ACCELERATOR_LABEL, PLATFORM_LABEL, ClusterView, NodeGroup
from webhook.drivers import DriverTable, Version, show
from webhook.model import JSON, as_dict, as_list, as_str

if TYPE_CHECKING:
    from webhook.registry import ImageConfig

Compatibility = Literal["strict", "minor"]
Verdict = bool | None
"""True: satisfied; False: not; None: a fact the requirement needs is unknown for the node group."""

KEYS = ("arch", "brand", "cuda", "driver")
OPERATORS = ("=", "!=", "<", "<=", ">", ">=")
_OPERATOR_CHARS = "<>=!"
_VERSION_TEXT = re.compile(r"^[0-9]{1,9}(?:\.[0-9]{1,9}){0,5}\Z")
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
"""strconv.ParseBool's true spellings (nvidia-container-toolkit reads NVIDIA_DISABLE_REQUIRE with it)."""
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
MAX_EXPRESSION = 4096
MAX_IMAGE = 512
DOCKER_HUB = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io", "registry.hub.docker.com"})
"""The names Docker Hub goes by in an image reference (and in a Docker config's ``auths``)."""
CUDA_VARIABLES = ("NVIDIA_DISABLE_REQUIRE", "NVIDIA_REQUIRE_CUDA", "CUDA_VERSION")
"""The env variables the runtime's CUDA check reads, in the order it reads them (2.-4. of the module docstring)."""


class RequirementError(ValueError):
    """A requirement expression or declared version that cannot be used; the message says which part and why."""


def _version(text: str) -> Version | None:
    return tuple(int(p) for p in text.split(".")) if _VERSION_TEXT.match(text) else None


def compare(a: Version, b: Version) -> int:
    """-1, 0, 1 as dsl_compare_version: numerically part by part, missing parts count as 0."""
    n = max(len(a), len(b))
    pa, pb = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
    return (pa > pb) - (pa < pb)


def _holds(order: int, op: str) -> bool:
    return {
        "=": order == 0,
        "!=": order != 0,
        "<": order < 0,
        "<=": order <= 0,
        ">": order > 0,
        ">=": order >= 0,
    }[op]


def major_minor(version: Version) -> Version:
    return (*version, 0)[:2]


def show_mm(version: Version) -> str:
    return show(major_minor(version))


# ---------------------------------------------------------------------------------------------------------------
# Requirement expressions


@dataclass(frozen=True)
class Condition:
    key: str
    """arch, brand, cuda or driver (lower case)."""
    op: str
    value: str
    version: Version | None = None
    """The value as a version, for every key but brand."""

    def __str__(self) -> str:
        return f"{self.key}{self.op}{self.value}"


@dataclass(frozen=True)
class Requirement:
    """An OR of AND-terms."""

    terms: tuple[tuple[Condition, ...], ...]
    text: str
    minor: bool = False
    """Judged by minor-version compatibility whatever ``cuda.compatibility`` says (``minor_compatible``)."""

    @property
    def cuda(self) -> Version | None:
        """The lowest CUDA (major.minor) any term accepts through a lower bound; None when no term bounds cuda.
        ``cuda>12.4`` is compared at major.minor too, so the lowest it accepts is 12.5."""
        floors: list[Version] = []
        for term in self.terms:
            bounds = [
                _next_minor(major_minor(c.version)) if c.op == ">" else major_minor(c.version)
                for c in term
                if c.key == "cuda" and c.version is not None and c.op in (">=", ">", "=")
            ]
            if bounds:
                floors.append(max(bounds))
        return min(floors) if floors else None

    @property
    def forward_terms(self) -> tuple[tuple[Condition, ...], ...]:
        """Terms that accept a node without asking its CUDA when another term asks it: the forward-compatibility
        alternatives of a CUDA requirement. None in an expression where no term asks the CUDA (``driver>=550``
        is a requirement on the driver, nothing forward)."""
        forward = tuple(t for t in self.terms if not any(c.key == "cuda" for c in t))
        return forward if len(forward) < len(self.terms) else ()

    def without_forward(self) -> Requirement:
        """Only the terms that ask the node's CUDA (forward compatibility not honoured); unchanged if none does."""
        kept = tuple(t for t in self.terms if any(c.key == "cuda" for c in t))
        return Requirement(kept, self.text, self.minor) if kept else self


def _next_minor(version: Version) -> Version:
    major, minor = (*version, 0)[:2]
    return (major, minor + 1)


def _condition(text: str) -> Condition:
    start = next((i for i, ch in enumerate(text) if ch in _OPERATOR_CHARS), -1)
    if start < 0:
        raise RequirementError(f"{text!r} has no operator (one of {' '.join(OPERATORS)})")
    if start == 0:
        raise RequirementError(f"{text!r} has no key before its operator")
    end = start
    while end < len(text) and text[end] in _OPERATOR_CHARS:
        end += 1
    key, op, value = text[:start].lower(), text[start:end], text[end:]
    if op not in OPERATORS:
        raise RequirementError(f"{text!r}: {op!r} is not an operator (use one of {' '.join(OPERATORS)})")
    if key not in KEYS:
        raise RequirementError(f"{text!r}: unknown key {text[:start]!r} (known: {', '.join(KEYS)})")
    if not value:
        raise RequirementError(f"{text!r} has no value")
    if key == "brand":
        if op not in ("=", "!="):
            raise RequirementError(f"{text!r}: brand compares only with = or !=")
        return Condition(key, op, value)
    version = _version(value)
    if version is None:
        raise RequirementError(f"{text!r}: {value!r} is not a version")
    return Condition(key, op, value, version)


@lru_cache(maxsize=4096)
def parse_requirement(text: str) -> Requirement:
    """Parse an NVIDIA_REQUIRE_CUDA expression; RequirementError names the bad part. Kept by text: the pods of
    a cluster declare a handful of expressions, again and again."""
    if len(text) > MAX_EXPRESSION:
        raise RequirementError(f"longer than {MAX_EXPRESSION} characters")
    terms: list[tuple[Condition, ...]] = []
    for or_part in text.split(" "):
        conditions = tuple(_condition(p) for p in or_part.split(",") if p)
        if conditions:
            terms.append(conditions)
    if not terms:
        raise RequirementError("empty expression")
    return Requirement(tuple(terms), text)


@lru_cache(maxsize=256)
def at_least(version: Version) -> Requirement:
    """``cuda>=<major.minor>``: what a declared version requires (one per version, shared: it is frozen)."""
    mm = major_minor(version)
    return Requirement(((Condition("cuda", ">=", show(mm), mm),),), f"cuda>={show(mm)}")


@lru_cache(maxsize=256)
def with_forward(version: Version, forward: Forward, loaded: bool = False) -> Requirement:
    """``cuda>=<major.minor>``, or, on a data-center GPU (``forward_possible``), a driver of one of the branches
    whose lowest drivers ``forward`` names: what an image that carries the forward-compatibility libraries
    documents (nvidia/cuda in its own NVIDIA_REQUIRE_CUDA, an NGC container in its release notes), written as
    that variable writes it (``driver>=535.86,driver<536``); on nodes of ``forward.platform`` only, when it names
    one. Without floors, ``at_least``."""
    if not forward.floors:
        return at_least(version)
    on = (Condition("platform", "=", forward.platform),) if forward.platform else ()
    terms = tuple(
        (*on, Condition("driver", ">=", show(f), f), Condition("driver", "<", str(f[0] + 1), (f[0] + 1,)))
        for f in forward.floors
    )
    own = at_least(version)
    text = " ".join([own.text, *(",".join(map(str, t)) for t in terms)])
    if loaded:  # the image's entrypoint loads its compat libraries itself: said as a condition, not in the text
        terms = tuple((*t, LOADED_BY_ENTRYPOINT) for t in terms)
    return Requirement((*own.terms, *terms), text)


@lru_cache(maxsize=256)
def minor_compatible(requirement: Requirement) -> Requirement:
    """``requirement`` judged by minor-version compatibility (``Requirement.minor``): the image bundles its CUDA
    libraries and has the runtime check nothing (``ImageRule.minor_compatible``), so NVIDIA's minor-version
    compatibility runs it on any driver of its major at or above the major's floor (``DriverTable.minor_floor``),
    whatever ``cuda.compatibility`` says."""
    return Requirement(requirement.terms, requirement.text, minor=True)


def is_minor_compatible(requirement: Requirement | None) -> bool:
    return requirement is not None and requirement.minor


LOADED_BY_ENTRYPOINT = Condition("loader", "=", "entrypoint")
"""On a forward-compatibility alternative: the image's own entrypoint loads its compat libraries (NGC's), so the
alternative holds where no container toolkit would (``NodeFacts.compat_wired``); always true as a condition."""


# ---------------------------------------------------------------------------------------------------------------
# Image references (data: data/cuda-images.yaml)


@dataclass(frozen=True)
class Forward:
    """The forward compatibility an image documents: the lowest driver of each branch its compat libraries run
    on, on data-center GPUs (470.57: R470 from 470.57 on); ``platform``: only its image for that CPU
    architecture carries them (nvidia/cuda's Ubuntu arm64 images had no compat package before 12.5.1)."""

    floors: tuple[Version, ...] = ()
    platform: str = ""


NO_FORWARD = Forward()


@dataclass(frozen=True)
class ImageRule:
    name: str
    source: str
    repository: re.Pattern[str]
    tag: re.Pattern[str]
    releases: Mapping[str, Version]
    secondary_releases: Mapping[str, Version]
    forward: Mapping[str, Forward]
    """The forward compatibility the image documents, by the version (or release) its tag names."""
    forward_known_only: bool = False
    """Read only the versions ``forward`` has a row for (an image whose other versions' forward compatibility is not
    known reads no CUDA, rather than one refused where its compat libraries would run it)."""
    sets_require_cuda: bool = False
    """The image's own env sets ``NVIDIA_REQUIRE_CUDA`` (the tag's version and ``forward``), which the runtime reads
    before a ``CUDA_VERSION`` of the pod's: the tag then decides over it."""
    forward_by_entrypoint: bool = False
    """The image's entrypoint loads its compat libraries itself (NGC's): its forward compatibility holds where no
    container toolkit loads them (GKE's driver installer), for a container that keeps that entrypoint."""
    minor_compatible: bool = False
    """The image bundles its CUDA libraries (pip wheels) and sets no CUDA variable, so the runtime checks nothing and
    NVIDIA's minor-version compatibility decides: any driver of its major at or above the major's floor runs it
    (``Requirement.minor``). pytorch/pytorch's runtime images: refused on a 535 driver under strict, they run there
    (found by a review of real images)."""


@dataclass(frozen=True)
class ImageMatch:
    version: Version
    rule: ImageRule
    secondary: bool
    detail: str
    """What in the reference said it, e.g. 'NGC framework container release 25.01'."""
    forward: Forward = NO_FORWARD
    """``ImageRule.forward`` for this version or release."""


def _versions(raw: object) -> dict[str, Version]:
    out: dict[str, Version] = {}
    for k, v in as_dict(raw).items():
        version = _version(str(v))
        assert version is not None, (k, v)
        out[str(k)] = version
    return out


@lru_cache(maxsize=1)
def _data() -> dict[str, Any]:
    text = resources.files("webhook.data").joinpath("cuda-images.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    assert isinstance(data, dict)
    return data


def _forward(raw: object) -> dict[str, Forward]:
    """``forward`` of a rule: the table it names (``nvidia_cuda_forward``: an image built on nvidia/cuda of the
    version its tag names), or its own. A row is the list of floors, or ``{<platform>: floors}`` where only that
    platform's image carries them; floors written as a CUDA release ('12.5.0') are that release's row of
    ``nvidia_cuda_forward`` (the branches its compat package runs on)."""
    table = _data()[raw] if isinstance(raw, str) else raw
    out: dict[str, Forward] = {}
    for key, row in as_dict(table).items():
        platform, floors = next(iter(row.items())) if isinstance(row, dict) else ("", row)
        if isinstance(floors, str):
            floors = list(_forward("nvidia_cuda_forward")[floors].floors)
        versions = tuple(f if isinstance(f, tuple) else _version(str(f)) for f in as_list(floors))
        assert versions and all(versions), (key, row)
        out[str(key)] = Forward(tuple(v for v in versions if v), str(platform))
    minors: dict[str, list[Forward]] = {}
    for key, row in out.items():
        if key.count(".") == 2:
            minors.setdefault(key.rsplit(".", 1)[0], []).append(row)
    # a tag that names only the minor release (pytorch's devel images, vLLM's -cuNNN, RAPIDS' -cudaX.Y) takes what
    # every release of the minor read carries, where two or more were read: their branches where they agree, on
    # the one CPU architecture any of them is restricted to (12.5.0's arm64 images carry no compat package, 12.5.1's
    # do: amd64, where both do; refused on every amd64 R535 node before, found by a review); none where the branches
    # differ, nor from one release alone (13.1.1's says nothing of 13.1.0, which was not found; a minor of one
    # release only, 11.8, has a row of its own in the data)
    shared: dict[str, Forward] = {}
    for minor, rows in minors.items():
        platforms = {r.platform for r in rows} - {""}
        if len(rows) > 1 and len({r.floors for r in rows}) == 1 and len(platforms) <= 1:
            shared[minor] = Forward(rows[0].floors, next(iter(platforms), ""))
    return {**{minor: row for minor, row in shared.items() if minor not in out}, **out}


@lru_cache(maxsize=1)
def image_rules() -> tuple[ImageRule, ...]:
    """The image rules, parsed and compiled once."""
    return tuple(
        ImageRule(
            name=str(r["name"]),
            source=str(r["source"]),
            repository=re.compile(str(r["repository"])),
            tag=re.compile(str(r["tag"])),
            releases=_versions(r.get("releases")),
            secondary_releases=_versions(r.get("secondary_releases")),
            forward=_forward(r.get("forward")),
            forward_known_only=bool(r.get("forward_known_only", False)),
            sets_require_cuda=bool(r.get("sets_require_cuda", False)),
            forward_by_entrypoint=bool(r.get("forward_by_entrypoint", False)),
            minor_compatible=bool(r.get("minor_compatible", False)),
        )
        for r in _data()["rules"]
    )


@lru_cache(maxsize=1)
def _disabling_rules() -> tuple[tuple[re.Pattern[str], str], ...]:
    """The repositories whose images set NVIDIA_DISABLE_REQUIRE themselves, and their names (``disables_require``)."""
    return tuple((re.compile(str(r["repository"])), str(r["name"])) for r in _data().get("disables_require", ()))


def disables_require(image: str) -> str:
    """The name of the rule that says ``image`` sets NVIDIA_DISABLE_REQUIRE itself; '' where none does."""
    if not image or len(image) > MAX_IMAGE:
        return ""
    repository, _ = split_image(image)
    return next((name for pattern, name in _disabling_rules() if pattern.fullmatch(repository)), "")


def load_data() -> None:
    """Read and compile the image rules and brands now (a server does it before it forks: the first request of
    each worker took 6-11 ms more, reading the YAML)."""
    image_rules()
    _brand_rules()
    _disabling_rules()


@lru_cache(maxsize=1)
def _brand_rules() -> tuple[tuple[re.Pattern[str], frozenset[str]], ...]:
    return tuple(
        (re.compile(str(r["product"])), frozenset(str(b).lower() for b in r["brands"])) for r in _data()["brands"]
    )


def split_image(image: str) -> tuple[str, str]:
    """'nvidia/cuda:12.4.1-base-ubuntu22.04' -> ('nvidia/cuda', '12.4.1-base-ubuntu22.04'); Docker Hub's registry
    and ``library/`` are dropped, other registries kept (lower case). The tag is '' when there is none."""
    name = image.strip().split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    tag = ""
    if colon > slash:
        name, tag = name[:colon], name[colon + 1 :]
    parts = name.split("/")
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        registry, path = parts[0].lower(), "/".join(parts[1:])
        if registry in DOCKER_HUB:
            registry = ""
    else:
        registry, path = "", name
    if not registry and path.startswith("library/"):
        path = path[len("library/") :]
    return (f"{registry}/{path}" if registry else path), tag


def image_cuda(image: str) -> ImageMatch | None:
    """The CUDA an image reference reveals, by the first rule that matches; None when none does, or when it is
    longer than ``MAX_IMAGE`` (checked before the cache: a pod's 1 MiB image was kept as a key for the process's
    life)."""
    return _image_cuda(image) if image and len(image) <= MAX_IMAGE else None


@lru_cache(maxsize=4096)
def _image_cuda(image: str) -> ImageMatch | None:
    """``image_cuda``, kept by reference: a cluster runs a handful of images, again and again."""
    repository, tag = split_image(image)
    if not tag:
        return None
    for rule in image_rules():
        if not rule.repository.fullmatch(repository):
            continue
        m = rule.tag.fullmatch(tag)
        if m is None:
            continue
        found = m.groupdict()
        if found.get("cuda"):
            version = _version(found["cuda"])
            forward = rule.forward.get(found["cuda"], NO_FORWARD)
            if version and (forward.floors or not rule.forward_known_only):
                return ImageMatch(version, rule, False, f"{rule.name} {tag}", forward)
        elif found.get("major") and found.get("minor"):
            version = (int(found["major"]), int(found["minor"]))
            forward = rule.forward.get(f"{version[0]}.{version[1]}", NO_FORWARD)
            return ImageMatch(version, rule, False, f"{rule.name} suffix cu{found['major']}{found['minor']}", forward)
        elif found.get("release"):
            release = found["release"]
            forward = rule.forward.get(release, NO_FORWARD)
            if release in rule.releases:
                return ImageMatch(rule.releases[release], rule, False, f"{rule.name} release {release}", forward)
            if release in rule.secondary_releases:
                version = rule.secondary_releases[release]
                return ImageMatch(version, rule, True, f"{rule.name} release {release}", forward)
        return None  # the image's own rule matched but does not know this tag: no other rule applies
    return None


# ---------------------------------------------------------------------------------------------------------------
# What a container declares


@dataclass(frozen=True)
class Declared:
    """A GPU container's CUDA requirement and where it came from."""

    container: str
    image: str
    requirement: Requirement | None = None
    """None: unknown, disabled, or unusable (see ``error``)."""
    source: str = ""
    """Where it came from, in words: 'env NVIDIA_REQUIRE_CUDA', 'image tag, nvidia/cuda 12.4.1-base-ubuntu22.04'."""
    disabled: bool = False
    """NVIDIA_DISABLE_REQUIRE is true: no check wanted."""
    error: str = ""
    """Why the declaration cannot be used (an invalid expression or version); empty when fine."""
    secondary: bool = False
    """The version comes from a secondary data row."""
    pending: bool = False
    """Unknown because the image's config is being read from its registry (``webhook.registry``)."""

    @property
    def version(self) -> Version | None:
        return self.requirement.cuda if self.requirement else None

    @property
    def version_text(self) -> str:
        """'CUDA 12.8', or the expression when it bounds no CUDA version."""
        if self.requirement is None:
            return "CUDA unknown"
        v = self.version
        return f"CUDA {show(v)}" if v else f"requirement {self.requirement.text}"


def env_values(container: JSON) -> dict[str, str]:
    """The container's env values by name as the runtime gets them (a later entry of the same name wins, as in the
    kubelet); values the webhook cannot know (``_env``) are left out."""
    return {name: value for name, value in _env(container).items() if isinstance(value, str)}


VALUE_FROM = "set by valueFrom"


@dataclass(frozen=True)
class Unread:
    """An env value known only to the kubelet, and why."""

    why: str


def _env(container: JSON) -> dict[str, str | Unread]:
    """The container's env by name, as the kubelet gives it to the runtime: ``$(NAME)`` references to the entries
    before expanded (``$$`` is a literal ``$``; a reference to a name not defined is left as written). ``Unread``
    for a value set by ``valueFrom`` (a ConfigMap, a Secret, a field), one that refers to such a value, and one
    that refers to a name not in ``env`` when the container has ``envFrom`` (which may define it)."""
    out: dict[str, str | Unread] = {}
    env_from = bool(as_list(container.get("envFrom")))
    budget = [EXPANSION_BUDGET]
    for item in as_list(container.get("env")):
        item = as_dict(item)
        name, value = item.get("name"), item.get("value")
        if not isinstance(name, str):
            continue
        if isinstance(value, str):
            out[name] = _expand(value, out, env_from, budget) if "$" in value else value
        elif "valueFrom" in item:
            out[name] = Unread(VALUE_FROM)
        else:
            out.pop(name, None)
    return out


_REFERENCE = re.compile(r"\$(?:\$|\(([^)]*)\))")
"""``$$`` or ``$(NAME)``, as the kubelet's expansion reads them (k8s.io/kubernetes
third_party/forked/golang/expansion: an unclosed ``$(`` and a ``$`` before anything else stay as written)."""


EXPANSION_BUDGET = 1 << 20
"""The most characters the ``$(NAME)`` references of one container's env may expand to, all values together: each
``V = "$(W)$(W)"`` doubles the text, so thirty such entries in a 2 kB pod would take gigabytes. Past it a value is
``Unread`` (a CUDA variable is a few characters)."""


def _expand(value: str, known: Mapping[str, str | Unread], env_from: bool, budget: list[int]) -> str | Unread:
    unread: list[str] = []

    def one(m: re.Match[str]) -> str:
        name = m.group(1)
        if name is None:
            return "$"
        found = known.get(name)
        if isinstance(found, str):
            budget[0] -= len(found)
            return found if budget[0] >= 0 else ""
        if found is not None or env_from:
            unread.append(name)
        return m.group(0)

    expanded = _REFERENCE.sub(one, value)
    if budget[0] < 0:
        return Unread(f"its $(NAME) references expand past {EXPANSION_BUDGET >> 20} MiB in all")
    if not unread:
        return expanded
    first = known.get(unread[0])
    if first is None:
        where = "a variable its envFrom may set"
    elif isinstance(first, Unread) and first.why == VALUE_FROM:
        where = "a value set by valueFrom"
    else:
        where = "a value the webhook cannot read either"
    return Unread(f"refers to $({unread[0][:63]}), {where}")


def _text(env: Mapping[str, str | Unread], var: str) -> str:
    value = env.get(var)
    return value.strip() if isinstance(value, str) else ""


def declared_cuda(
    container: JSON,
    annotations: Mapping[str, Any],
    use_image: bool = True,
    configs: Callable[[str], ImageConfig | None] | None = None,
) -> Declared:
    """What ``container`` needs, looked up in the documented order (see the module docstring); ``configs``: the
    image configs read from registries (``webhook.registry``), the last source, when that is on."""
    name = as_str(container.get("name"))
    image = as_str(container.get("image"))
    for key in (f"{PREFIX}cuda-version.{name}", f"{PREFIX}cuda-version"):
        value = annotations.get(key)
        if not isinstance(value, str) or not value.strip():
            continue
        source = f"annotation {key}"
        version = _version(value.strip())
        if version is None:
            return Declared(name, image, source=source, error=f'{value!r} is not a CUDA version (write e.g. "12.4")')
        requirement = at_least(version)
        if use_image and "NVIDIA_REQUIRE_CUDA" not in _env(container) and "CUDA_VERSION" not in _env(container):
            found = image_cuda(image) if image else None
            if found is not None and found.rule.minor_compatible:
                # the annotation says a version, not that anything checks it: nothing does in such an image (a
                # pytorch runtime image restated in the annotation was held to strict; found by a review)
                requirement = minor_compatible(requirement)
            elif found is not None and found.forward.floors and major_minor(version) <= major_minor(found.version):
                # the image's compat libraries (its tag's CUDA, at or above the annotation's) run it on the driver
                # branches they run its tag's CUDA on: an nvidia/cuda:12.4.1 image restated in the annotation, as
                # the 'CUDA version unknown' warning asks, was refused on R535 though it runs there (found by a
                # review); a newer version than the tag's is one they do not bring
                entrypoint = not container.get("command") and found.rule.forward_by_entrypoint
                requirement = with_forward(version, found.forward, loaded=entrypoint)
        return Declared(name, image, requirement, source)
    env = _env(container)
    for var in CUDA_VARIABLES:
        unread = env.get(var)
        if isinstance(unread, Unread):
            # what decides the CUDA check at run time is not in the pod: neither a lower source nor the image's
            # own value of it counts, since this one overrides them (the runtime reads the container's env); the
            # image's variables the runtime reads before it still do
            above = _image_above(name, image, env, configs, use_image, CUDA_VARIABLES[: CUDA_VARIABLES.index(var)])
            if above is not None:
                return above
            return Declared(name, image, source=f"env {var} ({unread.why}, which the webhook cannot read)")
        if var == "NVIDIA_DISABLE_REQUIRE" and _text(env, var) not in _TRUE:
            continue
        if _text(env, var):
            break
    if _text(env, "NVIDIA_DISABLE_REQUIRE") in _TRUE:
        return Declared(name, image, source="env NVIDIA_DISABLE_REQUIRE", disabled=True)
    if use_image and "NVIDIA_DISABLE_REQUIRE" not in env and (rule := disables_require(image)):
        # the image's own, under the container's env: the runtime checks nothing, whatever else the pod sets
        return Declared(name, image, source=f"its image sets NVIDIA_DISABLE_REQUIRE: {rule}", disabled=True)
    # Where the pod sets a variable, the image's config (read from its registry) may still set the ones before it
    # in the runtime's order: the runtime reads the image's env under the container's (6. in the module docstring).
    # Only a config already read counts here: the pod's own value stands meanwhile.
    text = _text(env, "NVIDIA_REQUIRE_CUDA")
    if text:
        above = _image_above(name, image, env, configs, use_image, ("NVIDIA_DISABLE_REQUIRE",))
        if above is not None:
            return above
        source = "env NVIDIA_REQUIRE_CUDA"
        try:
            return Declared(name, image, parse_requirement(text), source)
        except RequirementError as err:
            return Declared(name, image, source=source, error=f"invalid expression: {err}")
    text = _text(env, "CUDA_VERSION")
    if text:
        above = _image_above(name, image, env, configs, use_image, ("NVIDIA_DISABLE_REQUIRE", "NVIDIA_REQUIRE_CUDA"))
        if above is not None:
            return above
        version = _version(text)
        if version is None:
            return Declared(name, image, source="env CUDA_VERSION", error=f"{text!r} is not a CUDA version")
        return Declared(name, image, at_least(version), "env CUDA_VERSION")
    if use_image:
        found = image_cuda(image)
        if found:
            return _from_tag(
                name, image, found, emptied="NVIDIA_REQUIRE_CUDA" in env, entrypoint=not container.get("command")
            )
    if configs is not None and image and len(image) <= MAX_IMAGE:  # a longer one was kept as the reader's key
        return _from_config(name, image, configs(image), env)
    return Declared(name, image)


def _from_tag(
    name: str, image: str, found: ImageMatch, over: str = "", emptied: bool = False, entrypoint: bool = False
) -> Declared:
    """What the image's tag says, through its rule (``over``: the pod's variable its image's own env decides
    over; ``emptied``: the pod sets NVIDIA_REQUIRE_CUDA empty, which replaces an image's own, and the runtime
    then reads the image's CUDA_VERSION as ``cuda>=``, without the forward-compatibility terms; ``entrypoint``:
    the container keeps its image's entrypoint, no ``command`` of its own)."""
    secondary = ", secondary source" if found.secondary else ""
    source = f"image tag, {found.detail}{secondary}"
    requirement = with_forward(found.version, found.forward, loaded=entrypoint and found.rule.forward_by_entrypoint)
    if found.rule.minor_compatible:
        requirement = minor_compatible(requirement)
    if over:
        source += f": the image's NVIDIA_REQUIRE_CUDA, which the runtime reads before the pod's {over}"
    elif emptied and found.rule.sets_require_cuda:
        source += ": the image's CUDA_VERSION, the pod's empty NVIDIA_REQUIRE_CUDA replacing the image's"
        requirement = at_least(found.version)
    return Declared(name, image, requirement, source, secondary=found.secondary)


def _image_above(
    name: str,
    image: str,
    own: Mapping[str, object],
    configs: Callable[[str], ImageConfig | None] | None,
    use_image: bool,
    variables: tuple[str, ...],
) -> Declared | None:
    """What the image's own env says through ``variables`` (those the runtime reads before the pod's variable at
    hand), where the pod does not set them: the ``NVIDIA_REQUIRE_CUDA`` of an image whose tag rule knows it
    (``ImageRule.sets_require_cuda``), else its config read from its registry; None where neither says anything
    there. An image whose tag a rule reads is not asked of its registry (the rule stands for its config)."""
    requires = "NVIDIA_REQUIRE_CUDA" in variables and "NVIDIA_REQUIRE_CUDA" not in own
    tag = image_cuda(image) if use_image and image else None
    if tag is not None:
        return (
            _from_tag(name, image, tag, over=CUDA_VARIABLES[len(variables)])
            if requires and tag.rule.sets_require_cuda
            else None
        )
    if configs is None or not image:
        return None
    config = configs(image)
    if config is None or config.error or not any(v in config.env and v not in own for v in variables):
        return None
    read = _from_config(name, image, config, own)
    return read if read.disabled or (requires and config.env.get("NVIDIA_REQUIRE_CUDA", "").strip()) else None


def _from_config(name: str, image: str, config: ImageConfig | None, own: Mapping[str, object]) -> Declared:
    """What the image's config says (its env, under the container's own: a variable the pod sets, even empty,
    replaces the image's), read as the container's env is."""
    if config is None:
        return Declared(
            name,
            image,
            source="its image's config was not read yet (it is read from its registry in the background: pods"
            " created once it is read are checked)",
            pending=True,
        )
    if config.error:
        return Declared(name, image, source=f"its image's config is unread: {config.error}")
    env = {k: v.strip() for k, v in config.env.items() if k not in own}
    if env.get("NVIDIA_DISABLE_REQUIRE") in _TRUE:
        return Declared(name, image, source=f"image config NVIDIA_DISABLE_REQUIRE of {config.where}", disabled=True)
    if text := env.get("NVIDIA_REQUIRE_CUDA"):
        source = f"image config NVIDIA_REQUIRE_CUDA of {config.where}"
        try:
            return Declared(name, image, parse_requirement(text), source)
        except RequirementError as err:
            return Declared(name, image, source=source, error=f"invalid expression: {err}")
    if text := env.get("CUDA_VERSION"):
        source = f"image config CUDA_VERSION of {config.where}"
        version = _version(text)
        if version is None:
            return Declared(name, image, source=source, error=f"{text!r} is not a CUDA version")
        return Declared(name, image, at_least(version), source)
    return Declared(name, image, source=f"its image's config sets no CUDA variable ({config.where})")


# ---------------------------------------------------------------------------------------------------------------
# What a node group offers, and the evaluation


@dataclass(frozen=True)
class NodeFacts:
    cuda: Version | None
    """Newest CUDA (major.minor) the driver supports."""
    driver: Version | None
    brands: frozenset[str]
    """The brands the group's GPU may report (empty: unknown)."""
    arch: Version | None
    """Compute capability (nvidia.com/gpu.compute.major/minor)."""
    platform: str = ""
    """The nodes' CPU architecture (``kubernetes.io/arch``: amd64, arm64); '' when not known."""
    compat_wired: bool = True
    """The nodes' container runtime loads an image's compat libraries (the NVIDIA Container Toolkit's
    enable-cuda-compat hook); not where GKE's own driver installer and device plugin run the GPUs."""


def brands_of(product: str) -> frozenset[str]:
    for pattern, brands in _brand_rules():
        if pattern.fullmatch(product):
            return brands
    return frozenset()


def gpu_name(group: NodeGroup) -> str:
    """The group's GPU as GFD names it, else as GKE's accelerator label does (GKE's own driver installer: no GFD;
    its data-center GPUs were told "brand not known", and forward compatibility blamed on it)."""
    return group.gpu_product or group.labels.get(GKE_ACCELERATOR_LABEL, "")


def facts_of(group: NodeGroup) -> NodeFacts:
    """What a requirement is evaluated against on a group's nodes."""
    labels = group.labels
    return _facts(
        group.cuda, group.driver, gpu_name(group), labels.get(GFD + "gpu.compute.major", ""),
        labels.get(GFD + "gpu.compute.minor", ""), labels.get(PLATFORM_LABEL, ""), group.compat_wired,
    )  # fmt: skip


GRACE_PRODUCTS = re.compile(r"(?:^|-)G[BH]\d{3}(?:-|$)")
"""GPU products of NVIDIA's Grace superchips (GH200, GB200, GB300: the GPU beside an Arm Neoverse V2 CPU, the
nodes arm64): a declared pool naming one and no ``kubernetes.io/arch`` is taken as arm64."""


def gpu_arches(view: ClusterView) -> list[str]:
    """The CPU architectures of a view's GPU node groups (a declared Grace pool's arm64; '' where nothing says)."""
    return [
        g.labels.get(PLATFORM_LABEL) or ("arm64" if GRACE_PRODUCTS.search(g.gpu_product) else "")
        for g in view.gpu_groups
    ]


@functools.lru_cache(maxsize=1024)
def _facts(
    cuda: Version | None,
    driver: Version | None,
    product: str,
    major: str,
    minor: str,
    platform: str = "",
    wired: bool = True,
) -> NodeFacts:
    """The same few node shapes recur on every request: derive their facts (brand by regex, above all) once."""
    arch = (int(major), int(minor)) if major.isdigit() and minor.isdigit() and len(major + minor) < 8 else None
    return NodeFacts(
        cuda=major_minor(cuda) if cuda else None,
        driver=driver,
        brands=brands_of(product) if product else frozenset(),
        arch=arch,
        platform=platform,
        compat_wired=wired,
    )


def _condition_holds(c: Condition, facts: NodeFacts, table: DriverTable, compatibility: Compatibility) -> Verdict:
    if c.key == "platform":  # the webhook's own (``with_forward``), never read from an expression
        return facts.platform == c.value if facts.platform else None
    if c.key == "loader":  # the webhook's own too: read by ``forward_possible``
        return True
    if c.key == "brand":
        if not facts.brands:
            return None
        inside = c.value.lower() in facts.brands
        return inside if c.op == "=" else not inside
    assert c.version is not None
    if c.key == "cuda":
        if facts.cuda is None:
            return None
        want = major_minor(c.version)
        if _holds(compare(facts.cuda, want), c.op):
            return True
        floor = table.minor_floor.get(want[0])
        if compatibility == "minor" and c.op in (">=", ">") and floor and facts.driver is not None:
            # Minor-version compatibility: any <major>.x application runs on a driver at or above the floor.
            return compare(facts.driver, floor) >= 0
        return False
    have = facts.driver if c.key == "driver" else facts.arch
    if have is None:
        return None
    return _holds(compare(have, c.version), c.op)


DATA_CENTER_BRANDS = frozenset(("tesla", "nvidia"))
CONSUMER_BRANDS = frozenset(("geforce", "geforcertx", "titan", "titanrtx"))
"""Forward compatibility works only on data-center GPUs (and a few NGC server-ready RTX SKUs, which the brand does
not tell apart); elsewhere the CUDA application fails with error 804 although the runtime's check passed
(docs.nvidia.com/deploy/cuda-compatibility/forward-compatibility.html). nvidia/cuda images' NVIDIA_REQUIRE_CUDA
names the GeForce, Quadro and TITAN brands in its alternatives too. The driver branches an alternative names are
taken as written: the images list the branches their compat package supports."""


def forward_possible(facts: NodeFacts, term: Sequence[Condition] = ()) -> Verdict:
    """Can a newer CUDA run on this node group through forward compatibility (the alternative ``term``) at all?
    False where nothing loads the image's compat libraries (``NodeFacts.compat_wired``; an image whose entrypoint
    does, ``LOADED_BY_ENTRYPOINT``, aside); None when its GPU's brand is unknown, or is an RTX or Quadro one that
    may be a server-ready SKU."""
    if not facts.compat_wired and LOADED_BY_ENTRYPOINT not in term:
        return False
    if facts.brands & DATA_CENTER_BRANDS:
        return True
    return False if facts.brands & CONSUMER_BRANDS else None


def forward_barred(requirement: Requirement, facts: NodeFacts, table: DriverTable) -> bool:
    """A forward-compatibility alternative matches this node group's driver (its brand and CPU architecture aside),
    but forward compatibility cannot be known to work there (``forward_possible``): the reason a user needs to
    read (a GeForce is told of error 804, whatever its architecture)."""
    return any(
        forward_possible(facts, t) is not True and _driver_holds(t, facts, table) for t in requirement.forward_terms
    )


def forward_off_platform(requirement: Requirement, facts: NodeFacts, table: DriverTable) -> str:
    """The CPU architecture a forward-compatibility alternative is for, where it matches this node group's driver
    but not its architecture (or the architecture is not known); '' when none does."""
    for t in requirement.forward_terms:
        on = next((c for c in t if c.key == "platform"), None)
        if on is not None and facts.platform != on.value and _driver_holds(t, facts, table):
            return on.value
    return ""


def _driver_holds(term: tuple[Condition, ...], facts: NodeFacts, table: DriverTable) -> bool:
    """A forward-compatibility alternative's driver conditions hold here (its brand and CPU architecture aside)."""
    return _term_holds(tuple(c for c in term if c.key not in ("brand", "platform")), facts, table, "strict") is True


def _term_holds(
    term: tuple[Condition, ...], facts: NodeFacts, table: DriverTable, compatibility: Compatibility
) -> Verdict:
    result: Verdict = True
    for c in term:
        held = _condition_holds(c, facts, table, compatibility)
        if held is False:
            return False
        if held is None:
            result = None
    return result


def evaluate(
    requirement: Requirement, facts: NodeFacts, table: DriverTable, compatibility: Compatibility = "strict"
) -> Verdict:
    """Does a node group with ``facts`` satisfy ``requirement``? Three-valued: OR of ANDs over True/False/None. A
    forward-compatibility alternative holds only where forward compatibility can work (``forward_possible``)."""
    compatibility = "minor" if requirement.minor else compatibility
    result: Verdict = False
    forward = {id(t) for t in requirement.forward_terms}  # by identity: comparing terms was quadratic in them
    for term in requirement.terms:
        budget.check()
        held = _term_holds(term, facts, table, compatibility)
        if held is not False and id(term) in forward:
            possible = forward_possible(facts, term)
            if possible is not True:
                held = possible
        if held is True:
            return True
        if held is None:
            result = None
    return result


def unmet(requirement: Requirement, facts: NodeFacts, table: DriverTable, compatibility: Compatibility) -> list[str]:
    """The conditions of ``requirement``'s own terms (its forward-compatibility alternatives aside) that a node
    group with ``facts`` does not meet, each once, as written: what a denial names when a term asks more than a
    CUDA floor (``cuda>=12.0,driver<560``)."""
    compatibility = "minor" if requirement.minor else compatibility
    forward = {id(t) for t in requirement.forward_terms}
    out: list[str] = []
    for term in requirement.terms:
        budget.check()
        if id(term) in forward:
            continue
        for c in term:
            if _condition_holds(c, facts, table, compatibility) is False and str(c) not in out:
                out.append(str(c))
    return out


def accepted_by(requirement: Requirement, facts: NodeFacts, table: DriverTable) -> str:
    """How the requirement accepts a node it accepts: 'cuda' through the node's CUDA, 'forward' through a
    forward-compatibility alternative (driver branch and brand only), 'minor' through minor-version compatibility."""
    forward = requirement.forward_terms
    ids = {id(t) for t in forward}
    if any(_term_holds(t, facts, table, "strict") is True for t in requirement.terms if id(t) not in ids):
        return "cuda"
    if any(forward_possible(facts, t) and _term_holds(t, facts, table, "strict") is True for t in forward):
        return "forward"
    return "minor"


def forward_branches(requirement: Requirement) -> Sequence[str]:
    """Driver branches the forward-compatibility alternatives name ('470', '535', ...), for messages."""
    out: list[str] = []
    for term in requirement.forward_terms:
        for c in term:
            if c.key == "driver" and c.op in (">=", "=") and c.value not in out:
                out.append(c.value)
    return out
