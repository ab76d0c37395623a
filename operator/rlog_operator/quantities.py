"""Kubernetes quantities ("1Gi", "500M", "1e9") as numbers: the strict grammar the API
server accepts (no spaces, no "GB"), for spec.storage.size and spec.catchUpRate."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_SUFFIXES: dict[str, Decimal | int] = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))((?:[KMGTPE]i)|[numkMGTPE]|[eE][+-]?\d+)?$")


def quantity(value: object) -> Decimal:
    """A Kubernetes quantity ("1Gi", "500M", "1e9", 1073741824) as a number of bytes."""
    text = str(value).strip()
    match = _QUANTITY.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a quantity")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        base = Decimal(number)
    except InvalidOperation:
        raise ValueError(f"{text!r} is not a quantity") from None
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        return base * (Decimal(10) ** int(suffix[1:]))
    return base * Decimal(_SUFFIXES[suffix])
