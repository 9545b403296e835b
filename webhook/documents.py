"""Reading manifests and node lists as ``kubectl`` writes them: JSON, or YAML with one or more documents.

JSON (what ``kubectl get -o json`` prints) is read with the C JSON parser; YAML with libyaml's loader when PyYAML
has it. The pure-Python YAML loader reads about 0.2 MB/s, which for a 10,000-node list is minutes and a heap that
stays in the process after the documents are gone.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

from webhook.errors import InputError

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_documents(text: str, where: str) -> list[Any]:
    """The non-empty documents of ``text``; InputError naming ``where`` when it is neither JSON nor YAML."""
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        try:
            return [json.loads(text)]
        except (json.JSONDecodeError, RecursionError):
            pass  # YAML flow style looks like JSON too: let the YAML parser have it
        except ValueError as err:
            raise InputError(f"{where}: not usable JSON: {str(err)[:100]}") from err
    try:
        return [d for d in yaml.load_all(text, Loader=_Loader) if d is not None]
    except yaml.YAMLError as err:
        raise InputError(f"{where}: not valid YAML or JSON: {err}") from err


def read_documents(path: str | Path) -> list[Any]:
    """The documents of a file (``-``: standard input)."""
    where = str(path)
    try:
        text = sys.stdin.read() if where == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise InputError(f"{where}: cannot read: {err.strerror or err}") from err
    except UnicodeDecodeError as err:
        raise InputError(f"{where}: not UTF-8 text") from err
    return parse_documents(text, where)
