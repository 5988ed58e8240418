"""One short line per run event (partition, epoch, slowdown, fault, recovery, join, compression)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edgeagent.ops.monitor.values import _clip, _int, _ints, _num, _strs


def summarize(name: str, details: Mapping[str, Any]) -> str:
    """One short line for a run event, e.g. ``recovery case 3: lost worker-1, rolled back to 200``."""
    try:
        text = _summary(name, details)
    except Exception:  # details come from the network: never let a surprise break the screen
        text = None
    return _clip(text if text is not None else _generic(name, details), 110)


def _summary(name: str, d: Mapping[str, Any]) -> str | None:
    batch = _int(d, "batch")
    at = f" at batch {batch}" if batch is not None else ""
    if name == "partition":
        workers = _strs(d.get("workers"))
        on = f" on {', '.join(workers)}" if workers else ""
        return f"partition {_ints(d.get('points'))}{at}{on}"
    if name == "epoch":
        acc, loss = _num(d, "accuracy"), _num(d, "loss")
        text = f"epoch {_int(d, 'epoch')}: " + (f"{100 * acc:.1f}%" if acc is not None else "?")
        return text + (f", loss {loss:.3f}" if loss is not None else "")
    if name == "slowdown":
        factor = _num(d, "slowdown")
        return f"slowdown {d.get('device', '?')} {factor:.1f}x{at}" if factor is not None else None
    if name == "fault":
        devices = ", ".join(_strs(d.get("devices"))) or "?"
        reason = d.get("reason")
        return f"fault{at}: {devices}" + (f" ({reason})" if isinstance(reason, str) and reason else "")
    if name == "recovery":
        lost = ", ".join(_strs(d.get("lost"))) or "nothing"
        text = f"recovery case {d.get('case', '?')}: lost {lost}"
        restarted = _strs(d.get("restarted"))
        if restarted:
            text += f", restarted {', '.join(restarted)}"
        back = _int(d, "rolled_back_to")
        if back is not None and d.get("recovery_mode") == "resume":
            return text + f", no rollback: its layers from {back}, resumed at {_int(d, 'resumed_from')}"
        return text + (f", rolled back to {back}" if back is not None else "")
    if name == "failover":
        devices = ", ".join(_strs(d.get("devices"))) or "?"
        stages = ", ".join(str(k) for k in _ints(d.get("stages"))) or "?"
        return f"failover{at}: {devices} gone, stage {stages} goes on (no rollback)"
    if name == "join":
        return f"join {d.get('device', '?')}{at}"
    if name == "compression":
        epoch = _int(d, "epoch")
        when = f" (epoch {epoch})" if epoch is not None else ""
        return f"compression forward {_bits(d.get('forward'))}, backward {_bits(d.get('backward'))}{when}"
    return None


def _generic(name: str, details: Mapping[str, Any]) -> str:
    pairs = ", ".join(f"{k}={v}" for k, v in list(details.items())[:6])
    return f"{name} {pairs}".rstrip()


def _bits(value: Any) -> str:
    if isinstance(value, dict):
        value = [value[k] for k in sorted(value, key=lambda k: int(k) if str(k).isdigit() else 0)]
    if isinstance(value, list):
        return "[" + ", ".join("off" if not isinstance(b, int) or b >= 32 else str(b) for b in value) + "]"
    return str(value)
