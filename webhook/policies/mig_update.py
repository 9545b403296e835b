"""The mig policy on a workload's update: what an earlier conversion wrote into the template is taken out where the
ask comes back, changes or goes, so that every policy judges the pod the user wrote, and the mig policy converts
the template's fractions afresh, together (``forget``, before every policy runs).

A workload's template is reviewed again on each update, and what the webhook wrote into it on the last one is
still there: ``kubectl apply`` (client-side) merges the manifest into the live object, Helm 3 merges three ways,
``kubectl edit`` and ``replace`` send the object back whole. Only the conversion's line (``mig_record``) tells what
the webhook wrote from what the user did; the placement it wrote is taken out only by a line as stored
(``Context.stored``), never by words an update or a create could forge.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from webhook.cluster import GPU_RESOURCE, GPU_TAINT_TOLERATION, MIG_RESOURCE_PREFIX
from webhook.model import (
    GPU_MEMORY_RESOURCE,
    JSON,
    Context,
    Outcome,
    PodView,
    applied_by_kubectl,
    as_dict,
    as_list,
    as_str,
    escaped,
    fit_warning,
    manifest_template_spec,
)
from webhook.policies import mig_record as record
from webhook.policies.mig import all_pin_keys, holds_given, mig_resources, named, raw_text, sections
from webhook.policies.mig_record import Line, Pin
from webhook.quantity import QuantityError, parse_quantity


def forget(pod: PodView, ctx: Context, out: Outcome) -> None:
    """Before any policy runs: take out of a workload's template what an earlier conversion wrote where the ask
    came back (``_forget_earlier``), so that every policy judges the pod the user wrote (the spot policy, first,
    judged a template moved to never under the earlier review's partition pin: found by a generative review)."""
    if not ctx.settings.mig.enabled or not pod.is_template:
        return
    forgotten = _forget_earlier(pod, ctx)
    if forgotten:
        out.mutated("mig-reconverted")
    gone = [e for e in forgotten if e.taken and not _asks_again(e.container)]
    if gone:  # said, as nothing else will: the template's line goes with the conversion
        out.finish.append(lambda: _say_taken(pod, out, gone))


def _say_taken(pod: PodView, out: Outcome, gone: Sequence[_Earlier]) -> None:
    """Warn of what conversions that no longer stand had written and the final template no longer holds (another
    conversion, made afresh, may have written the same partition selector again: a generative review)."""
    for e in gone:
        taken = [
            t if isinstance(t, str) else record.pin_text(t) for t in dict.fromkeys(e.taken) if not _holds(pod, e, t)
        ]
        if taken:
            out.warn(fit_warning(f"{e.name}: took out the earlier conversion's {' and '.join(taken)}", e.name))


def _holds(pod: PodView, e: _Earlier, taken: str | Pin) -> bool:
    """Whether the pod still holds what ``_Earlier.taken`` names: a device or the one GPU given, or a pin."""
    if not isinstance(taken, str):
        return record.carries(pod, taken)
    resource = taken.partition(" ")[0]
    return any(raw_text(section.get(resource)) == "1" for section in sections(e.container))


def _asks_again(container: JSON) -> bool:
    """The container asks for a fraction or a memory size in its limits or requests (as a manifest writes it)."""
    return _asks_fraction(container) or any(GPU_MEMORY_RESOURCE in section for section in sections(container))


def _asks_fraction(container: JSON) -> bool:
    """The container asks for a fraction of ``nvidia.com/gpu`` in its limits or requests."""
    for section in sections(container):
        try:
            amount = parse_quantity(section[GPU_RESOURCE]) if GPU_RESOURCE in section else None
        except QuantityError:
            continue
        if amount is not None and amount != amount.to_integral_value():
            return True
    return False


def _asks_other_whole(container: JSON) -> bool:
    """The container's limits ask whole GPUs, but not the one a conversion to ``nvidia.com/gpu 1`` writes: the user
    changed the ask, which a manifest need not say (a Helm release, a server-side apply: the partition pin stayed,
    and a pod of 2 GPUs was sent to a partition of one)."""
    try:
        amount = parse_quantity(sections(container)[0].get(GPU_RESOURCE))
    except (QuantityError, TypeError):
        return False
    return amount == amount.to_integral_value() and amount != 1


def _forget_earlier(pod: PodView, ctx: Context) -> list[_Earlier]:
    """A workload's container whose earlier conversion its line names ('trainer: nvidia.com/gpu 0.5 ->
    nvidia.com/mig-3g.40gb (...)') and that asks for a fraction or a memory size again (or, beside a MIG device,
    for whole GPUs): what that conversion wrote is taken out, to convert the ask afresh. ``kubectl apply``
    (client-side) merges the manifest into the live object: the fraction comes back, changed or not, beside the
    device the webhook wrote (on single-strategy and GKE nodes, beside its request of one GPU and its
    nodeSelector), and was refused as a second device, or as a request unequal to the limit. A nodeSelector the
    manifest itself writes (its last-applied-configuration says so) is the user's pin, and stays. A forged line can
    only take out a device beside a fraction, which is refused otherwise: the placement a conversion wrote goes
    only by a line as stored (``_release``). The conversions so treated."""
    lines = record.lines_of(ctx)
    keys = all_pin_keys(ctx)
    earlier: list[_Earlier] = []
    fresh = False
    for _, name, container in named(pod):
        text = lines.get(name, "")
        line = record.parse(text, keys)
        if line.conversion:
            earlier.append(_drop(pod, ctx, _Earlier(name, container, text, line)))
        elif _asks_fraction(container):
            fresh = True  # a container's first fraction (a memory size waits for the pods): converted beside them
    _release(pod, ctx, earlier, fresh)
    _untolerate(pod, ctx, earlier)
    forgotten = [e for e in earlier if e.changed]
    for e in forgotten:
        resources = as_dict(e.container.get("resources"))
        for section_name in ("limits", "requests"):
            if resources.get(section_name) == {}:
                del resources[section_name]
    return forgotten


@dataclass
class _Earlier:
    """A container's earlier conversion, as its line names it, and what became of it here."""

    name: str
    container: JSON
    text: str
    """Its line as found on the object."""
    line: Line
    """The line read (its pin only on the keys the webhook pins by)."""
    dropped: bool = False
    """It no longer stands: the ask came back or changed, the manifest dropped it, or what it gave is gone."""
    taken: list[str | Pin] = field(default_factory=list)
    """What of it was taken out here: what it gave ('nvidia.com/mig-3g.40gb', 'nvidia.com/gpu 1'), or a pin."""
    asked_again: bool = False
    """Its ask was put back, to convert it afresh with the others (``_ask_again``)."""

    @property
    def changed(self) -> bool:
        """The container, or the placement its conversion wrote, changed."""
        return bool(self.taken) or self.asked_again

    @property
    def given(self) -> str:
        return self.line.given


def _drop(pod: PodView, ctx: Context, e: _Earlier) -> _Earlier:
    """Take out what the conversion wrote into the container where its ask came back or changed, or where the
    manifest dropped it; note whether it still stands."""
    given = e.given
    limits, requests = sections(e.container)
    asks = {**limits, **requests}
    others = [r for r in mig_resources(e.container) if r != given]
    if given.startswith(MIG_RESOURCE_PREFIX) and (GPU_RESOURCE in asks or GPU_MEMORY_RESOURCE in asks or others):
        # the ask is back (in limits, requests or both), or is now for whole GPUs or a MIG device of the user's own
        # (the webhook writes no second one: Helm's merge left the conversion's beside it, refused as two devices)
        if any([section.pop(given, None) is not None for section in (limits, requests)]):
            e.taken.append(given)
        e.dropped = True
    elif given.startswith(f"{GPU_RESOURCE} 1") and (_asks_again(e.container) or _asks_other_whole(e.container)):
        for section in (limits, requests):  # the one GPU the conversion wrote, where the ask itself is not
            if raw_text(section.get(GPU_RESOURCE)) == "1":
                del section[GPU_RESOURCE]
                e.taken.append(f"{GPU_RESOURCE} 1")
        e.dropped = True
    manifest = _manifest_container(pod, e.name)
    if manifest is not None and not _asks_again(manifest) and _dropped(ctx, pod, e.name):
        if _take_out(e.container, given, manifest):
            e.taken.append(given.partition(record.WITH_SELECTOR)[0])
        e.dropped = True
    # what it gave is gone (a Helm upgrade's merge deleted the webhook's one GPU with the fraction of its last
    # manifest; an edit took the device out): its placement goes too (a generative review)
    e.dropped = e.dropped or not holds_given(e.text, e.container, pod.spec)
    return e


def _release(pod: PodView, ctx: Context, earlier: Sequence[_Earlier], fresh: bool = False) -> None:
    """A template's conversions are chosen together, under the placement (``Line.placement``) their lines say they
    wrote.
    Where a conversion that no longer stands wrote placement the pod still holds, or where an ask is to be
    converted afresh (asked again, or a container's first: ``fresh``) while a standing conversion's placement
    holds the pod, every standing conversion is converted afresh too, its ask put back as its line says, and that
    placement is taken out for the conversion to choose anew. Only stored lines count (``record.stored``); where a
    standing conversion cannot be put back (its line not as stored), the placement stays.

    Found by generative reviews: a sidecar's 1g.10gb, 1/4 of the 40 GB A100s its trainer's pin held it to, was
    left to land on an 80 GB A100 (1/8) when the trainer's conversion went; a sidecar's new 0.5 was refused under
    the trainer's pin, which the same template new does without."""
    gone = [e for e in earlier if e.dropped and record.stored(ctx, e.text)]
    standing = [e for e in earlier if not e.dropped]
    freed = {pin for e in gone for pin in e.line.placement if record.carries(pod, pin)}
    held = {pin for e in standing for pin in e.line.placement if record.carries(pod, pin)}
    converted_afresh = fresh or any(_asks_again(e.container) for e in gone)
    if not freed and not (held and converted_afresh):
        return
    if not all(record.stored(ctx, e.text) and e.line.asked_gpu for e in standing):
        return
    for e in standing:
        _ask_again(e)
    gone += standing
    for pin in sorted(freed | held):
        if record.unpin(pod, pin):
            for e in gone:
                if pin in e.line.placement:
                    e.taken.append(pin)


UNTOLERATED = "its toleration of the GPU taint"
"""What ``_untolerate`` took out, as the warning of an update names it."""


def _untolerate(pod: PodView, ctx: Context, earlier: Sequence[_Earlier]) -> None:
    """Take out the toleration of the GPU taint that a conversion which went had written (its stored line says
    so), where no container asks a GPU any more, unless the manifest kubectl applied writes it: a Deployment whose
    fraction was dropped kept it, and its CPU pods could take the GPU nodes (a reviewer's question). Where a GPU
    is still asked, it stays (another conversion may need it); a conversion made afresh writes it again."""
    wrote = [e for e in earlier if e.dropped and e.line.tolerated and record.stored(ctx, e.text)]
    if not wrote or any(_asks_gpu(c) for _, _, c in named(pod)):
        return
    tolerations = pod.spec.get("tolerations")
    if not isinstance(tolerations, list) or GPU_TAINT_TOLERATION not in tolerations:
        return
    if GPU_TAINT_TOLERATION in as_list(manifest_template_spec(pod).get("tolerations")):
        return
    tolerations.remove(GPU_TAINT_TOLERATION)
    if not tolerations:
        del pod.spec["tolerations"]
    wrote[0].taken.append(UNTOLERATED)


def _asks_gpu(container: JSON) -> bool:
    """The container asks a GPU in any form: whole, a fraction, a memory size, a MIG device, a shared GPU."""
    return any(
        isinstance(key, str) and (key == GPU_MEMORY_RESOURCE or key.startswith((GPU_RESOURCE, MIG_RESOURCE_PREFIX)))
        for section in sections(container)
        for key in section
    )


def _ask_again(e: _Earlier) -> None:
    """Put a standing conversion's ask (a fraction of ``nvidia.com/gpu``, as its stored line says) back where it
    gave its device, to convert it afresh."""
    amount = e.line.asked_gpu
    resource = e.given.partition(" ")[0]  # a MIG device, or the one (shared) GPU given, with its selector
    for section in sections(e.container):
        if resource in section and (resource.startswith(MIG_RESOURCE_PREFIX) or raw_text(section[resource]) == "1"):
            del section[resource]
            section[GPU_RESOURCE] = amount
            e.asked_again = True
    e.dropped = True


def manifest_asks(pod: PodView) -> dict[str, list[dict[str, object]]]:
    """What the manifest client-side ``kubectl apply`` sent asks of GPUs, by container: its limits' and requests'
    ``nvidia.com/gpu``, memory size and MIG devices (empty without a manifest)."""
    spec = manifest_template_spec(pod)
    asks: dict[str, list[dict[str, object]]] = {}
    for list_name in ("initContainers", "containers"):
        for c in as_list(spec.get(list_name)):
            if isinstance(c, dict):
                asks[as_str(c.get("name"))] = [
                    {k: v for k, v in section.items() if k in _ASK_KEYS or k.startswith(MIG_RESOURCE_PREFIX)}
                    for section in sections(c)
                ]
    return asks


_ASK_KEYS = frozenset({GPU_RESOURCE, GPU_MEMORY_RESOURCE})


def _manifest_container(pod: PodView, name: str) -> JSON | None:
    """The container ``name`` of the manifest client-side ``kubectl apply`` sent; None without one."""
    if not applied_by_kubectl(pod):
        return None
    spec = manifest_template_spec(pod)
    for list_name in ("initContainers", "containers"):
        for c in as_list(spec.get(list_name)):
            if isinstance(c, dict) and escaped(as_str(c.get("name"))) == name:  # as ``named`` gives it
                return c
    return None


def _dropped(ctx: Context, pod: PodView, name: str) -> bool:
    """Whether the manifest kubectl applied before this update asked a fraction or a memory size for container
    ``name``: this update's manifest, which asks none, dropped it. Without that, the manifest may be stale (only
    client-side ``kubectl apply`` writes it: a fraction set by ``kubectl edit`` later, converted, lost its device to
    the next image change: a review of this session's commits)."""
    if not isinstance(ctx.old_object, dict):
        return False
    before = _manifest_container(PodView(pod.kind, {}, {}, pod.namespace, root=ctx.old_object), name)
    return before is not None and _asks_again(before)


def _take_out(container: JSON, given: str, manifest: JSON) -> bool:
    """What a conversion (``given``) wrote where the manifest now asks for no fraction nor memory size: none at
    all (a CPU-only container now: it kept its MIG device, and on single-strategy and GKE nodes the webhook's
    request of one GPU without its limit, which the apiserver refuses), or whole GPUs (kept off whole GPUs by the
    partition pin, which ``_release`` takes out): a generative review. What the manifest writes itself stays.
    Whether the container changed."""
    limits, requests = sections(container)
    own_limits, own_requests = sections(manifest)
    changed = False
    if given.startswith(MIG_RESOURCE_PREFIX):
        for section, own in ((limits, own_limits), (requests, own_requests)):
            if given in section and given not in own:
                del section[given]
                changed = True
        return changed
    if not given.startswith(f"{GPU_RESOURCE} 1"):
        return False
    for section, own in ((limits, own_limits), (requests, own_requests)):
        if raw_text(section.get(GPU_RESOURCE)) == "1" and GPU_RESOURCE not in own:
            del section[GPU_RESOURCE]
            changed = True
    return changed
