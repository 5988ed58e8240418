"""What refusing values that are not finite costs a receiver: the check next to decoding the message.

    python bench/finite.py

Every message a role accepts has each of its floating-point tensors checked for NaN and infinities
(``protocol.limits.nonfinite_problem``, on the network thread after decoding). This times that check
against decoding the same payload, for the largest activation and gradient of a batch of 32 and for a
whole-model replica (weights and momentum) of the default MLP and of MobileNetV2 on digits, with one
torch thread. Each figure is the median of many repetitions.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from edgeagent.data import load_dataset
from edgeagent.models import ModelSpec, build_model, layer_output_shapes
from edgeagent.protocol.limits import nonfinite_problem
from edgeagent.protocol.messages import Activation, Gradient, Message, Weights
from edgeagent.protocol.wire import decode, encode


def _median_seconds(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _cases() -> list[tuple[str, Message]]:
    data = load_dataset("digits", seed=0, test_fraction=0.2)
    cases: list[tuple[str, Message]] = []
    for name in ("mlp", "mobilenetv2"):
        spec = ModelSpec(name, data.in_shape, data.num_classes)
        shapes = layer_output_shapes(spec)
        widest = max(shapes, key=lambda shape: torch.Size(shape[1:]).numel())
        x = torch.randn(32, *widest[1:])  # (B, ...) the largest output of a layer
        y = torch.zeros(32, dtype=torch.int64)
        cases.append(
            (
                f"{name} activation {tuple(x.shape)}",
                Activation(run_id="r", plan_id=0, stage=0, batch_id=0, version=0, mode="train", x=x, y=y),
            )
        )
        cases.append(
            (
                f"{name} gradient {tuple(x.shape)}",
                Gradient(run_id="r", plan_id=0, stage=1, batch_id=0, g=x, loss=1.0),
            )
        )
        state = {f"layers.{k}": v for k, v in build_model(spec, seed=0).state_dict().items()}
        momentum = {k: v.clone() for k, v in state.items() if v.is_floating_point()}
        params = sum(t.numel() for t in state.values())
        cases.append(
            (
                f"{name} replica, whole model ({params} parameters, weights and momentum)",
                Weights(
                    run_id="r",
                    device_id="w",
                    stage=1,
                    start=0,
                    end=1,
                    version=1,
                    tensors=state,
                    purpose="global",
                    optimizer=momentum,
                ),
            )
        )
    return cases


def main() -> None:
    torch.set_num_threads(1)
    for label, msg in _cases():
        payload = encode(msg, sender="w")
        reps = 300 if len(payload) < 1_000_000 else 30
        decoding = _median_seconds(lambda payload=payload: decode(payload), reps)  # type: ignore[misc]
        _, decoded = decode(payload)
        checking = _median_seconds(lambda decoded=decoded: nonfinite_problem(decoded), reps)  # type: ignore[misc]
        print(
            f"{label}: {len(payload) / 1e3:.1f} kB; decode {decoding * 1e6:.1f} us, finiteness check "
            f"{checking * 1e6:.1f} us ({100 * checking / decoding:.0f}% of decoding)"
        )


if __name__ == "__main__":
    main()
