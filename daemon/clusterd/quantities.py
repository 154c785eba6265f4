"""Kubernetes quantities ("500m", "8Gi", "7985404Ki", "2", "1e3") as numbers: what the
provider reads of nodes and pods, and what the config file's sizes are checked with."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_SUFFIXES = {
    "Ki": Decimal(1024), "Mi": Decimal(1024**2), "Gi": Decimal(1024**3),
    "Ti": Decimal(1024**4), "Pi": Decimal(1024**5), "Ei": Decimal(1024**6),
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12),
    "P": Decimal(10**15), "E": Decimal(10**18),
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)"
                       r"(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")


def parse_quantity(text: object) -> float:
    """A Kubernetes quantity ("500m", "8Gi", "7985404Ki", "2", "1e3") as a number."""
    found = _QUANTITY.match(str(text).strip())
    if not found:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    try:
        number = Decimal(found.group(1))
    except InvalidOperation:
        raise ValueError(f"not a Kubernetes quantity: {text!r}") from None
    return float(number * _SUFFIXES[found.group(2) or ""])
