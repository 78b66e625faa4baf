"""Strict JSON for everything rksp writes: NaN and infinities become null (jq and browsers reject them)."""

from __future__ import annotations

import json
import math


def finite(obj: object) -> object:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def dumps(data: object, indent: int | None = 2) -> str:
    return json.dumps(finite(data), indent=indent)
