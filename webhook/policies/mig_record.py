"""What a MIG conversion leaves on the object: its line in ``gpu-admission.io/mig``, and the pin it writes.

One line per converted container, the lines joined by ``SEPARATOR``::

    trainer: nvidia.com/gpu 0.5 -> nvidia.com/mig-3g.40gb (NVIDIA-A100-SXM4-80GB, pool a100)
    <name>: <asked> -> <given> (<profile>, <note>, <own>, <pin>, <where>)

``asked`` is the request as the user wrote it (``ASKED``); ``given`` what the container got: a mixed-strategy
device, or ``nvidia.com/gpu 1`` with the nodeSelector of a single-strategy product or GKE partition size. Between
the parentheses, each part only when it applies: the MIG profile of a plain ``nvidia.com/gpu 1`` that a
single-strategy pool at zero gives (``MIG 3g.40gb``: pinned by the pool's own label, the nodeSelector of its
product is not written, and the profile is known from the line alone); a fallback's note (``NOTES``) or the note
of a pin made for all the pod's fractions (``TOGETHER``); ``OWN_SELECTOR`` where that nodeSelector was the pod's
before the conversion; the pin to GPU models or a pool (``pinned to <key>=<a> or <b>``); where the pod can get its
GPU. A line that no conversion wrote names what the container holds: ``<name>: <given> (as found on the
object)``.

The line is the record a workload's later update reads (``mig_update``): what the conversion wrote, to take out
where the ask comes back or changes. A conversion's line is written by ``str(Line)`` and read by ``parse``; the
'as found on the object' line is written by ``mig._state_line`` and read by ``given_of``.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

from webhook.affinity import expression, holds, manifest_expressions, require, unnarrow
from webhook.model import Context, PodView, as_dict, manifest_template_spec

ANNOTATION = "mig"
"""The annotation (``gpu-admission.io/mig``) that holds the lines."""
SEPARATOR = "; "
"""Between the containers' lines; a line itself never holds it."""

Pin = tuple[str, tuple[str, ...]]
"""A label key and the values a conversion pinned the pod to (one: a nodeSelector; more: required affinity)."""

ASKED = re.compile(
    r"^(nvidia\.com/gpu|gpu-admission\.io/gpu-memory|gpu-admission\.io/gpu-fraction) [-+0-9.eE]{1,64}[A-Za-z]{0,2}$"
)
"""A request in one of the forms a line writes it: only such a line is taken for a conversion's."""
NO_PROFILE = "no MIG profile covers it"
WHOLE_NOTE = f"whole GPU: {NO_PROFILE}"
SHARED_NOTE = f"time-sliced shared GPU: {NO_PROFILE}"
"""What a fallback's line says: true too where a profile covers it only on drivers too old for its CUDA (one that
cannot run it covers nothing), so that a later review, under the fallback's own pin, says the same."""
TOGETHER = "the pod's fractions fit together only there"
"""What the line of the first conversion made on one model or pool says of its pin: why the pod was pinned where
each fraction alone would have had more places."""
OWN_SELECTOR = "the pod's own nodeSelector"
"""How a line says that the nodeSelector its conversion names (a single-strategy MIG product, a GKE partition
size) was the pod's before the conversion: no later change of the ask takes it out."""
TOLERATED = "the GPU taint tolerated"
"""How a line says its conversion wrote the toleration of the GPU taint (``nvidia.com/gpu Exists``): the MIG device
asks no nvidia.com/gpu, so ExtendedResourceToleration no longer adds it. Taken out when the conversion goes and no
container asks a GPU any more (a CPU-only template kept it, and its pods could take the GPU nodes)."""
NOWHERE_NOW = "no node it can run on offers it now"
"""Where a line says a converted device is when no node the pod can run on offers it (a MIG layout changed)."""
WITH_SELECTOR = " with nodeSelector "
"""Between ``nvidia.com/gpu 1`` and the nodeSelector a single-strategy or GKE conversion gives."""

PROFILE = "MIG "
"""Before the profile a by-pool conversion gave as ``nvidia.com/gpu 1`` ('MIG 3g.40gb')."""

_WORDS = re.compile(
    rf"^(?:{PROFILE}([^\s,]+), )?"
    rf"(?:({'|'.join(re.escape(n) for n in (WHOLE_NOTE, SHARED_NOTE, TOGETHER))}), )?({re.escape(OWN_SELECTOR)}, )?"
    r"(?:pinned to ([^\s=,]+)=([^\s,]+(?: or [^\s,]+)*), )?"
    rf"({re.escape(TOLERATED)}, )?"
)


@dataclass(frozen=True)
class Line:
    """One container's line (the module's docstring). Only a line whose ``asked`` is in a form a conversion writes
    (``conversion``) is taken for a conversion's; ``asked`` is empty on a line without ' -> '."""

    name: str
    asked: str
    given: str
    note: str = ""
    own: bool = False
    pin: Pin | None = None
    where: str = ""
    tolerated: bool = False
    profile: str = ""
    """The MIG profile of a single-strategy pool at zero given as a plain ``nvidia.com/gpu 1`` (``PROFILE``)."""

    def __str__(self) -> str:
        pin = f"pinned to {pin_text(self.pin)}" if self.pin else ""
        profile = PROFILE + self.profile if self.profile else ""
        parts = (
            profile,
            self.note,
            OWN_SELECTOR if self.own else "",
            pin,
            TOLERATED if self.tolerated else "",
            self.where,
        )
        words = ", ".join(p for p in parts if p)
        return f"{self.name}: {self.asked} -> {self.given} ({words})"

    @property
    def conversion(self) -> bool:
        """It names a request in a form a conversion writes (only the amount, a bare number, is taken on trust)."""
        return bool(ASKED.match(self.asked))

    @property
    def asked_gpu(self) -> str:
        """The amount of ``nvidia.com/gpu`` asked ('0.25'); '' for another ask."""
        resource, _, amount = self.asked.partition(" ")
        return amount if resource == "nvidia.com/gpu" else ""

    @property
    def selector(self) -> Pin | None:
        """The nodeSelector ``given`` names (a single-strategy product, a GKE partition size)."""
        key, _, value = self.given.partition(WITH_SELECTOR)[2].partition("=")
        return (key, (value,)) if key else None

    @property
    def placement(self) -> set[Pin]:
        """What of the pod's placement the conversion wrote: its pin, and its nodeSelector unless that was the
        pod's own."""
        pins = {self.pin} if self.pin else set()
        if self.selector and not self.own:
            pins.add(self.selector)
        return pins


def parse(text: str, pin_keys: Collection[str] = ()) -> Line:
    """The parts of a line; a pin is read only on a key the webhook pins by (``pin_keys``): a line forged into a
    template and confirmed by its own selector on another key (team=ml) would be kept, and its selector taken out
    at the next change of the ask."""
    name, _, rest = text.partition(": ")
    asked, arrow, tail = rest.partition(" -> ")
    if not arrow:
        return Line(name, "", given_of(text))
    given, paren, words = tail.partition(" (")
    found = _WORDS.match(words) if paren else None
    if found is None:
        return Line(name, asked, given)
    pin = (found[4], tuple(found[5].split(" or "))) if found[4] in pin_keys else None
    where = words[found.end() :].removesuffix(")")
    own = bool(found[3]) and WITH_SELECTOR in given
    return Line(name, asked, given, found[2] or "", own, pin, where, bool(found[6]), found[1] or "")


def given_of(text: str) -> str:
    """What a line (a conversion's, or one 'as found on the object') says the container got."""
    _, _, rest = text.partition(": ")
    return rest.partition(" -> ")[2].partition(" (")[0] if " -> " in rest else rest.partition(" (")[0]


def lines_of(ctx: Context) -> dict[str, str]:
    """The lines of the object under review (``ctx.prior``) by container name, the first of each name."""
    lines: dict[str, str] = {}
    for line in ctx.prior.get(ANNOTATION, "").split(SEPARATOR):
        name, sep, _ = line.partition(": ")
        if sep and name and name not in lines:
            lines[name] = line
    return lines


def stored(ctx: Context, line: str) -> bool:
    """Whether ``line`` is an earlier review's own, as stored: only such a line takes a pin out (one forged into
    the object named a template's own nodeSelector, which another admission controller may have set)."""
    return line in ctx.stored.get(ANNOTATION, "").split(SEPARATOR)


def pin_text(pin: Pin) -> str:
    """'nvidia.com/gpu.product=A' or 'nvidia.com/gpu.product=A or B'."""
    key, values = pin
    return f"{key}={' or '.join(values)}"


def write_pin(pod: PodView, pin: Pin) -> None:
    """Pin the pod: a nodeSelector for one value, else required affinity."""
    key, values = pin
    if len(values) == 1:
        pod.spec_dict("nodeSelector")[key] = values[0]
    else:
        require(pod, [expression(key, "In", values)])


def carries(pod: PodView, pin: Pin) -> bool:
    """Whether the pod holds the pin as ``write_pin`` writes it."""
    key, values = pin
    if len(values) == 1:
        return as_dict(pod.spec.get("nodeSelector")).get(key) == values[0]
    return holds(pod, [[expression(key, "In", values)]])


def unpin(pod: PodView, pin: Pin) -> bool:
    """Take a pin an earlier conversion wrote out of the pod, unless the manifest kubectl applied writes it;
    whether the pod changed."""
    key, values = pin
    if not carries(pod, pin):
        return False
    if len(values) > 1:
        return unnarrow(pod, [[expression(key, "In", values)]], keep=manifest_expressions(pod))
    selector = as_dict(pod.spec.get("nodeSelector"))
    if as_dict(manifest_template_spec(pod).get("nodeSelector")).get(key) == values[0]:
        return False
    del selector[key]
    if not selector:
        del pod.spec["nodeSelector"]
    return True
