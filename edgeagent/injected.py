"""What a test, a bench or a lab injects into a run: emulated slowdown changes (``--slowdown-change``) and
values that are not finite in what a device sends (``--send-nan``). Parsers only; the roles act on them."""

from __future__ import annotations

from edgeagent.errors import ConfigError


def parse_slowdown_change(text: str) -> tuple[str, int, float]:
    """``"worker-2@300=5"`` -> ``("worker-2", 300, 5.0)``."""
    try:
        device, rest = text.split("@", 1)
        batch, factor = rest.split("=", 1)
        parsed = device, int(batch), float(factor)
    except ValueError:
        raise ConfigError(
            f"slowdown change {text!r}: expected DEVICE@BATCH=SLOWDOWN, e.g. worker-2@300=5"
        ) from None
    if parsed[1] < 0 or parsed[2] < 1:
        raise ConfigError(f"slowdown change {text!r}: batch must be >= 0 and slowdown >= 1")
    return parsed


NAN_KINDS = ("activation", "gradient", "replica", "sync")
"""What ``--send-nan`` can fill with NaN: outgoing activations, gradients, chain and global replicas, or a
replicated stage's gradient sums (hybrid)."""


def parse_send_nan(text: str) -> tuple[str, int, bool]:
    """``"gradient@40"`` -> ``("gradient", 40, False)``: NaN in that one message; ``"gradient@40+"``: in
    every such message from batch 40 on (a replica's batch is its version)."""
    kind, _, rest = text.partition("@")
    forever = rest.endswith("+")
    try:
        batch = int(rest.removesuffix("+"))
    except ValueError:
        batch = -1
    if kind not in NAN_KINDS or batch < 0:
        raise ConfigError(
            f"--send-nan {text!r}: expected KIND@BATCH or KIND@BATCH+ with KIND one of "
            f"{', '.join(NAN_KINDS)} and BATCH >= 0, e.g. gradient@40"
        )
    return kind, batch, forever


__all__ = ["NAN_KINDS", "parse_send_nan", "parse_slowdown_change"]
