"""Kubernetes resource quantities (``500m``, ``20Gi``, ``1e3``) as exact Decimals.

Grammar from k8s.io/apimachinery ``pkg/api/resource/quantity.go``: a signed decimal number, then an optional suffix:
binary (Ki Mi Gi Ti Pi Ei), decimal SI (n u m "" k M G T P E) or a decimal exponent (e3, E-2).
"""

import re
from decimal import Decimal, InvalidOperation
from functools import lru_cache

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}
_QUANTITY = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]{1,3})?\Z"
)


class QuantityError(ValueError):
    """Not a Kubernetes quantity."""


def parse_quantity(value: object) -> Decimal:
    """Parse a quantity as the apiserver would; raise QuantityError naming the value otherwise."""
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise QuantityError(f"{value!r} is not a quantity")
        return Decimal(repr(value))
    if not isinstance(value, str) or len(value) > 64:
        raise QuantityError(f"{str(value)[:40]!r} is not a quantity")
    return _parse_text(value)


@lru_cache(maxsize=1024)
def _parse_text(value: str) -> Decimal:
    """The same few texts ("1", "500m", "16Gi") come in every pod: each parsed once (a Decimal is immutable)."""
    match = _QUANTITY.match(value.strip())
    if not match:
        raise QuantityError(f"{value!r} is not a quantity (expected e.g. 1, 500m, 20Gi)")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        base = Decimal(number)
        if suffix in _BINARY:
            return base * _BINARY[suffix]
        if suffix in _DECIMAL:
            return base * _DECIMAL[suffix]
        return base.scaleb(int(suffix[1:]))
    except (InvalidOperation, ValueError) as err:
        raise QuantityError(f"{value!r} is not a quantity") from err


def format_quantity(value: Decimal) -> str:
    """Shortest plain rendering: 0.5 -> '500m', 2 -> '2'."""
    if value == value.to_integral_value():
        return str(int(value))
    milli = value * 1000
    if milli == milli.to_integral_value():
        return f"{int(milli)}m"
    return format(value.normalize(), "f")
