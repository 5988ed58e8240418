"""Reading values that come from the network: every type is checked, nothing here raises."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def _num(values: Mapping[str, Any], key: str) -> float | None:
    v = values.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        number = float(v)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _int(values: Mapping[str, Any], key: str) -> int | None:
    v = values.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _ints(value: Any) -> list[int]:
    if not isinstance(value, list):
        return []
    return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]


def _strs(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
