"""
Kubernetes resource quantities (`100m`, `1Gi`, `1024Mi`, `1e3`) as exact numbers, so that drift is
judged on what a quantity means, not on how it is spelt.

The API server stores a quantity in its canonical form: `1024Mi` is read back as `1Gi`, `1000m` as
`1`, `0.5` as `500m`. Compared as text, every such field would look edited on every reconcile (an
apply and a DriftCorrected event each time, for ever). The grammar is apimachinery's `resource.Quantity`:

    quantity  ::= sign? digits ('.' digits?)? suffix?   |  sign? '.' digits suffix?
    suffix    ::= Ki | Mi | Gi | Ti | Pi | Ei            binary, powers of 1024
               |  n | u | m | k | M | G | T | P | E     decimal, powers of 1000
               |  (e | E) sign? digits                   decimal exponent
"""

from __future__ import annotations

import decimal
import re
from typing import Any

_QUANTITY = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?\d+)?$")
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_EXPONENT_MAX = 64
"""Larger exponents are not quantities a manifest means (and would make Decimal arithmetic costly)."""


def parse(value: Any) -> decimal.Decimal | None:
    """The exact value of a quantity (a string, or a number as YAML may give it); None if it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return decimal.Decimal(value)
    if isinstance(value, float):
        return decimal.Decimal(str(value))
    if not isinstance(value, str):
        return None
    match = _QUANTITY.match(value.strip())
    if match is None:
        return None
    number, suffix = decimal.Decimal(match.group(1)), match.group(2) or ""
    if suffix in _BINARY:
        return number * decimal.Decimal(1024) ** _BINARY[suffix]
    if suffix in _DECIMAL:
        return number.scaleb(_DECIMAL[suffix])
    exponent = int(suffix[1:])
    if abs(exponent) > _EXPONENT_MAX:
        return None
    return number.scaleb(exponent)


def same(desired: Any, live: Any) -> bool:
    """Whether two quantities mean the same amount (both must parse)."""
    a, b = parse(desired), parse(live)
    return a is not None and b is not None and a == b
