"""Reading manifests and node lists as ``kubectl`` writes them: JSON, or YAML with one or more documents.

JSON (what ``kubectl get -o json`` prints) is read with the C JSON parser; YAML with libyaml's loader when PyYAML
has it. The pure-Python YAML loader reads about 0.2 MB/s, which for a 10,000-node list is minutes and a heap that
stays in the process after the documents are gone.

YAML is read as kubectl reads it before it sends an object (sigs.k8s.io/yaml, over go-yaml v2, YAML 1.1): a
timestamp stays the string it is written as (go-yaml v2 keeps timestamp-like values strings when decoding into an
untyped value); ``api_object`` then holds a manifest to what JSON can carry, as kubectl's conversion does.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, ClassVar

import yaml

from webhook.errors import InputError

_Base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_TIMESTAMP = "tag:yaml.org,2002:timestamp"


class _Loader(_Base):  # type: ignore[misc]
    """The safe loader (libyaml's when there is one; its resolver is Python's), reading no timestamps."""

    yaml_implicit_resolvers: ClassVar[dict[Any, Any]] = {
        first: [(tag, pattern) for tag, pattern in resolvers if tag != _TIMESTAMP]
        for first, resolvers in _Base.yaml_implicit_resolvers.items()
    }


def parse_documents(text: str, where: str) -> list[Any]:
    """The documents of ``text`` as they stand in it, an empty or null one as None (so that the n-th is the one an
    editor shows as the n-th); InputError naming ``where`` when it is neither JSON nor YAML."""
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        try:
            return [json.loads(text)]
        except (json.JSONDecodeError, RecursionError):
            pass  # YAML flow style looks like JSON too: let the YAML parser have it
        except ValueError as err:
            raise InputError(f"{where}: not usable JSON: {str(err)[:100]}") from err
    try:
        return list(yaml.load_all(text, Loader=_Loader))
    except (yaml.YAMLError, ValueError) as err:  # ValueError: a value YAML cannot build (!!int abc, 5,000 digits)
        raise InputError(f"{where}: not valid YAML or JSON: {err}") from err


def read_documents(path: str | Path) -> list[Any]:
    """The documents of a file (``-``: standard input), as ``parse_documents`` gives them."""
    where = str(path)
    try:
        text = sys.stdin.read() if where == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise InputError(f"{where}: cannot read: {err.strerror or err}") from err
    except UnicodeDecodeError as err:
        raise InputError(f"{where}: not UTF-8 text") from err
    return parse_documents(text, where)


def numbered(documents: list[Any], where: str) -> list[tuple[str, Any]]:
    """The documents that hold something, each with where it stands: ``where: document N`` where several do,
    numbered from 1 as they stand in the text, empty and null ones counted (the n-th an editor shows; left out of
    the count, a message named another document), else ``where`` alone."""
    present = [(number, doc) for number, doc in enumerate(documents, 1) if doc is not None]
    return [(where if len(present) == 1 else f"{where}: document {number}", doc) for number, doc in present]


def api_object(value: Any, where: str) -> Any:
    """``value`` as kubectl would send it to the API server: JSON. A key YAML reads as a number or a boolean
    becomes its text (``1``, ``true``), as sigs.k8s.io/yaml writes it; a NaN, an infinity, or a value JSON has no
    type for (a YAML set, binary data) is an InputError naming where it stands (kubectl refuses them too)."""
    try:
        return _json_value(value, "", [MAX_VALUES])
    except _NotJSON as err:
        raise InputError(f"{where}: {err.path or 'the document'}: {err.what}; the API server takes JSON") from None
    except RecursionError:
        raise InputError(f"{where}: nested too deep to be a Kubernetes object") from None


class _NotJSON(Exception):
    def __init__(self, path: str, what: str) -> None:
        super().__init__(path, what)
        self.path, self.what = path, what


MAX_VALUES = 1_000_000
"""The most values one document may hold once its YAML aliases are expanded: ``&a`` / ``*a`` anchors that refer to
lists of aliases grow as a power of the nesting (a 629-byte file took 1.3 GB before it was refused), as go-yaml
refuses "excessive aliasing"."""


def _json_value(value: Any, path: str, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise _NotJSON(path, f"more than {MAX_VALUES:,} values once its YAML aliases are expanded")
    if isinstance(value, dict):
        return {_json_key(k, path): _json_value(v, _child(path, k), budget) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_value(v, f"{path}[{i}]", budget) for i, v in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        raise _NotJSON(path, f"{value} is not a JSON number")
    if value is None or isinstance(value, (str, int, float)):  # bool is an int
        return value
    what = _NOT_JSON_TYPES.get(type(value), f"a value of type {type(value).__name__}")
    raise _NotJSON(path, f"{what} is not a JSON value")


_NOT_JSON_TYPES: dict[type, str] = {
    bytes: "binary data (!!binary)",
    set: "a set (!!set)",
    tuple: "a key-value pair (!!pairs, !!omap)",
}


def _json_key(key: Any, path: str) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        return str(key)
    raise _NotJSON(path, f"the key {key!r} is not a string")


def _child(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)
