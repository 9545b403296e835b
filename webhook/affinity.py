"""Node affinity edits shared by the policies: narrow required affinity, add preferred terms, idempotently.

Required node affinity is an OR of terms, each an AND of expressions. Narrowing a pod to "any of these
alternatives" is therefore a product: every existing term ANDed with every alternative. Expressions already present
are not added twice, so applying the same narrowing again changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from webhook import budget
from webhook.model import JSON, PodView, as_dict, as_list, copy_json, manifest_template_spec

Expression = JSON
"""{"key": ..., "operator": ..., "values": [...]}"""


def expression(key: str, operator: str, values: Sequence[str] = ()) -> Expression:
    e: Expression = {"key": key, "operator": operator}
    if operator in ("In", "NotIn", "Gt", "Lt"):
        e["values"] = list(values)
    return e


def _required(pod: PodView) -> JSON:
    affinity = pod.spec_dict("affinity")
    node = affinity.get("nodeAffinity")
    if not isinstance(node, dict):
        node = affinity["nodeAffinity"] = {}
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution")
    if not isinstance(required, dict):
        required = node["requiredDuringSchedulingIgnoredDuringExecution"] = {}
    return required


def required_terms(pod: PodView) -> list[JSON]:
    """The pod's required node selector terms as they stand (empty when there is no required affinity)."""
    required = as_dict(
        as_dict(as_dict(pod.spec.get("affinity")).get("nodeAffinity")).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
    )
    return [t for t in as_list(required.get("nodeSelectorTerms")) if isinstance(t, dict)]


def _with(term: JSON, extra: Sequence[Expression]) -> JSON:
    out = copy_json(term)
    exprs = out.get("matchExpressions")
    if not isinstance(exprs, list):
        exprs = out["matchExpressions"] = []
    for e in extra:
        if e not in exprs:
            exprs.append(copy_json(e))
    return out


def _implied(term: JSON, alternative: Sequence[Expression]) -> bool:
    budget.check()
    exprs = as_list(term.get("matchExpressions"))
    return all(e in exprs for e in alternative)


def _empty(term: JSON) -> bool:
    """A term with no expressions and no fields: it matches no node ("a null or empty node selector term matches
    no objects", core/v1 NodeSelectorTerm), and nothing ANDed into it changes that."""
    return not term.get("matchExpressions") and not term.get("matchFields")


def narrow(pod: PodView, alternatives: Sequence[Sequence[Expression]]) -> bool:
    """Require the pod to land where one of ``alternatives`` (each an AND of expressions) holds.

    Existing terms are kept and each is combined with each alternative. Returns whether the pod changed.
    A term that already implies one of the alternatives is kept as it is (so a second run is a no-op), and so is
    an empty term, which matches no node: narrowing never makes a term match nodes it did not.
    """
    if not alternatives:
        return False
    existing = required_terms(pod)
    if existing and all(_empty(t) or any(_implied(t, alt) for alt in alternatives) for t in existing):
        return False
    base = existing or [{}]
    terms = _Terms()
    for term in base:
        if existing and (_empty(term) or any(_implied(term, alt) for alt in alternatives)):
            terms.add(copy_json(term))
            continue
        for alt in alternatives:
            budget.check()
            terms.add(_with(term, alt))
    _required(pod)["nodeSelectorTerms"] = terms.kept
    return True


def holds(pod: PodView, alternatives: Sequence[Sequence[Expression]]) -> bool:
    """Whether ``narrow(pod, alternatives)`` has been applied: the pod has required terms, each implying one of the
    alternatives (or empty)."""
    existing = required_terms(pod)
    return bool(alternatives and existing) and all(
        _empty(t) or any(_implied(t, alt) for alt in alternatives) for t in existing
    )


def json_key(value: object) -> bytes | object:
    """``value`` as bytes that equal values share (JSON, keys sorted), to keep in a set: membership in a list of
    expressions was quadratic, and a forged annotation or manifest of thousands took seconds to minutes (a review
    that measured the costliest pods); what orjson cannot write stands for itself (its ``id``: only equal to
    itself)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return ("id", id(value))


def manifest_expressions(pod: PodView) -> frozenset[object]:
    """The ``json_key``s of the expressions in the required terms of the manifest kubectl applied: the user's own,
    which what the webhook takes out of a template (an earlier steering, an earlier spot mode's places) leaves
    alone, though it may equal one the webhook writes."""
    manifest = PodView(pod.kind, {}, manifest_template_spec(pod), pod.namespace)
    return frozenset(json_key(e) for t in required_terms(manifest) for e in as_list(t.get("matchExpressions")))


class _Terms:
    """Terms in order, each once: compared by their JSON with sorted keys (a scan of the list was quadratic, and a
    pod of thousands of terms took seconds); what orjson cannot write, by equality."""

    def __init__(self) -> None:
        self.kept: list[JSON] = []
        self._seen: set[bytes] = set()

    def add(self, term: JSON) -> bool:
        try:
            key = orjson.dumps(term, option=orjson.OPT_SORT_KEYS)
        except TypeError:
            if term in self.kept:
                return False
        else:
            if key in self._seen:
                return False
            self._seen.add(key)
        self.kept.append(term)
        return True


def require(pod: PodView, expressions: Sequence[Expression]) -> bool:
    """AND ``expressions`` into every required term (creating one when there is none)."""
    return narrow(pod, [list(expressions)])


def prefer(pod: PodView, expressions: Sequence[Expression], weight: int = 100) -> bool:
    """Add a preferred node affinity term unless an equal one is already there."""
    affinity = pod.spec_dict("affinity")
    node = affinity.get("nodeAffinity")
    if not isinstance(node, dict):
        node = affinity["nodeAffinity"] = {}
    preferred = node.get("preferredDuringSchedulingIgnoredDuringExecution")
    if not isinstance(preferred, list):
        preferred = node["preferredDuringSchedulingIgnoredDuringExecution"] = []
    wanted = [copy_json(e) for e in expressions]
    for existing in preferred:
        if isinstance(existing, dict) and as_dict(existing.get("preference")).get("matchExpressions") == wanted:
            return False
    preferred.append({"weight": weight, "preference": {"matchExpressions": wanted}})
    return True


def _prune(pod: PodView) -> None:
    """Drop the nodeAffinity and affinity maps that an undo left empty."""
    affinity = as_dict(pod.spec.get("affinity"))
    node = as_dict(affinity.get("nodeAffinity"))
    if "nodeAffinity" in affinity and not node:
        del affinity["nodeAffinity"]
    if "affinity" in pod.spec and not affinity:
        del pod.spec["affinity"]


def unnarrow(
    pod: PodView,
    alternatives: Sequence[Sequence[Expression]],
    keep: frozenset[object] = frozenset(),
    narrowed: bool = False,
) -> bool:
    """Undo ``narrow``: take each alternative's expressions out of every required term (the terms it multiplied
    become the ones it started from again); a term left with nothing, which was only an alternative, goes, and the
    required affinity with the last of them. Expressions in ``keep`` (``json_key``s: the user's own,
    ``manifest_expressions``) stay. With ``narrowed`` (``alternatives`` are those of one ``narrow``), a term is
    taken apart only where narrow can have made it (``_made``): one narrow kept as it was, since it implied an
    alternative on its own, is the pod's own. Returns whether the pod changed."""
    drop = {k for alt in alternatives for e in alt if (k := json_key(e)) not in keep}
    existing = required_terms(pod)
    if not drop or not any(json_key(e) in drop for t in existing for e in as_list(t.get("matchExpressions"))):
        return False
    made = _made(existing, alternatives) if narrowed else None
    kept = _Terms()
    for term in existing:
        budget.check()
        if made is not None and id(term) not in made:
            kept.add(copy_json(term))
            continue
        out = copy_json(term)
        exprs = [e for e in as_list(out.get("matchExpressions")) if json_key(e) not in drop]
        if exprs:
            out["matchExpressions"] = exprs
        else:
            out.pop("matchExpressions", None)
        if not (_empty(out) and not _empty(term)):
            kept.add(out)
    terms = kept.kept
    node = as_dict(as_dict(pod.spec.get("affinity")).get("nodeAffinity"))
    if terms:
        node["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] = terms
    else:
        del node["requiredDuringSchedulingIgnoredDuringExecution"]
        _prune(pod)
    return True


def _made(terms: Sequence[JSON], alternatives: Sequence[Sequence[Expression]]) -> set[int]:
    """The ``id``s of ``terms`` that ``narrow(alternatives)`` can have made; the others were the pod's own, though
    no manifest says so (a Helm release, the Job a CronJob makes; found as a Karpenter spot term widened to every
    provider's spot places on the next pass). Narrow keeps a term whole when it implies an alternative, or
    multiplies it by every alternative, its own expressions first (``_with``). So the terms made from one term
    share what they hold besides the alternatives' expressions (their base) and are at least as many as the
    alternatives, each alternative in one of them; from no terms at all (a base of nothing) they are every term.
    Where some term begins with an expression of its own (there were terms), one that begins with an
    alternative's but holds more was kept as it was. A later narrowing (the CUDA steering: by a pool selector
    that may also be a spot place) only appends expressions and multiplies terms, which keeps all this."""
    keys = [{json_key(e) for e in alt} for alt in alternatives]
    placed = set().union(*keys)
    held = [([json_key(e) for e in as_list(t.get("matchExpressions"))], t) for t in terms]
    had_terms = any(exprs and exprs[0] not in placed for exprs, _ in held)
    groups: dict[tuple[frozenset[object], object], list[tuple[set[object], JSON]]] = {}
    for exprs, term in held:
        budget.check()
        own = frozenset(set(exprs) - placed)
        if had_terms and own and exprs[0] in placed:
            continue
        groups.setdefault((own, json_key(term.get("matchFields"))), []).append((set(exprs), term))
    nothing: tuple[frozenset[object], object] = (frozenset(), json_key(None))
    out: set[int] = set()
    for base, group in groups.items():
        if base == nothing and (len(group) < len(terms) or any(_empty(t) for _, t in group)):
            continue  # narrow multiplies a base of nothing only where there were no terms
        if len(group) >= len(keys) and all(any(alt <= exprs for exprs, _ in group) for alt in keys):
            out.update(id(term) for _, term in group)
    return out


def unprefer(pod: PodView, alternatives: Sequence[Sequence[Expression]], weight: int = 100) -> bool:
    """Undo ``prefer``: remove the preferred terms it added for ``alternatives``; whether the pod changed."""
    node = as_dict(as_dict(pod.spec.get("affinity")).get("nodeAffinity"))
    preferred = node.get("preferredDuringSchedulingIgnoredDuringExecution")
    if not isinstance(preferred, list):
        return False
    added = [{"weight": weight, "preference": {"matchExpressions": list(alt)}} for alt in alternatives]
    kept = [p for p in preferred if p not in added]
    if len(kept) == len(preferred):
        return False
    if kept:
        node["preferredDuringSchedulingIgnoredDuringExecution"] = kept
    else:
        del node["preferredDuringSchedulingIgnoredDuringExecution"]
        _prune(pod)
    return True
