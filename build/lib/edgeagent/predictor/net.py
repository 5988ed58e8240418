"""The latency predictor's regression model (papers/004 Sec. 3.2), pre-training and adaptive update.

``T = f(s, h)``: ``s`` is a sub-model's binary layer-presence vector, ``h`` the device's measured times of
the ten representative sub-models. Two variants share one training loop:

* ``paper`` -- the paper's dual-stream model as written: two fully connected layers on ``s``, their
  output concatenated with ``h``, two more layers to the time (four in all). Times and ``h`` enter in
  log space, normalised over the training set (the paper does not say how it scales them).
* ``features`` (ours) -- the same dual stream, three differences measured against ``paper`` in
  ``bench/predictor.py``: (1) it predicts the *residual* over the device's own FLOPs interpolation
  (``log T`` minus the piecewise-linear interpolation of ``log h`` over the representative sub-models'
  ``log FLOPs``), so a device uniformly ``c`` times slower shifts ``log h`` and ``log T`` alike and
  the network sees nothing new; (2) ``h`` enters as its shape (``log h`` minus its mean); (3) an
  ensemble of three, whose spread is the uncertainty of a prediction. Its pre-training is longer (8,000
  steps, the learning rate decayed to zero on a cosine) on wider layers (128): on the 24-configuration
  set that took the held-out share within ±10 % from 89 % (64 wide, 3,000 steps at a constant rate) to
  about 94 %, and its share on its own training configurations was 85 %, so the narrower net underfit.

Adaptive update (Sec. 3.2): :meth:`LatencyPredictor.adapt` continues training on the pre-training data
``D`` together with a device's measured samples ``D^`` (over-sampled so that eight of them count
among thousands), starting from the current weights.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from torch import nn

from edgeagent.predictor.submodels import REPRESENTATIVES, Range, all_ranges, encode, representative

Variant = Literal["paper", "features"]
VARIANTS: tuple[Variant, ...] = ("paper", "features")
_FLOPS_FLOOR = 1e5  # a layer without FLOPs (flatten) still costs a little: keeps log FLOPs finite
WIDTHS: dict[Variant, int] = {"paper": 64, "features": 128}
STEPS: dict[Variant, int] = {"paper": 3000, "features": 8000}  # pre-training steps


@dataclass(frozen=True)
class Sample:
    """One measurement: the sub-model ``[start, end)`` took ``seconds`` on a device whose vector is ``h``."""

    start: int
    end: int
    h: tuple[float, ...]
    seconds: float

    def __post_init__(self) -> None:
        if len(self.h) != REPRESENTATIVES:
            raise ValueError(f"h has {len(self.h)} entries, need {REPRESENTATIVES}")
        if not all(math.isfinite(v) and v > 0 for v in (*self.h, self.seconds)):
            raise ValueError(f"times must be finite and > 0: h {self.h}, seconds {self.seconds}")


class DualStream(nn.Module):
    """Two layers on the sub-model's inputs, concatenated with the device's ``h``, two more to the output."""

    def __init__(self, s_features: int, width: int, h_features: int = REPRESENTATIVES) -> None:
        super().__init__()
        self.s_stream = nn.Sequential(
            nn.Linear(s_features, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU()
        )
        self.head = nn.Sequential(nn.Linear(width + h_features, width), nn.ReLU(), nn.Linear(width, 1))

    def forward(self, s: torch.Tensor, h: torch.Tensor) -> torch.Tensor:  # (N, S), (N, H) -> (N,)
        out: torch.Tensor = self.head(torch.cat([self.s_stream(s), h], dim=1)).squeeze(1)
        return out


@dataclass
class _Norm:
    """Affine normalisations fitted on the pre-training data (kept with the weights)."""

    h_mean: float = 0.0
    h_std: float = 1.0
    y_mean: float = 0.0
    y_std: float = 1.0

    def to_dict(self) -> dict[str, float]:
        return {"h_mean": self.h_mean, "h_std": self.h_std, "y_mean": self.y_mean, "y_std": self.y_std}


@dataclass
class LatencyPredictor:
    """A trained predictor for one model: :meth:`predict` gives seconds for sub-models on a device."""

    variant: Variant
    layer_flops: tuple[float, ...]
    nets: list[DualStream]
    norm: _Norm
    data: list[Sample] = field(default_factory=list)  # D, kept for the adaptive update
    seed: int = 0

    # -- construction ----------------------------------------------------------------------

    @classmethod
    def fit(
        cls,
        samples: Sequence[Sample],
        layer_flops: Sequence[float],
        *,
        variant: Variant = "features",
        steps: int | None = None,
        seed: int = 0,
    ) -> LatencyPredictor:
        """Pre-train on ``samples`` (papers/004 Sec. 3.2 "Pre-training"); ``steps`` defaults to the
        variant's (:data:`STEPS`)."""
        if variant not in VARIANTS:
            raise ValueError(f"unknown predictor variant {variant!r}; choose one of {', '.join(VARIANTS)}")
        if not samples:
            raise ValueError("no samples to pre-train the predictor on")
        count = 3 if variant == "features" else 1
        flops = tuple(float(f) for f in layer_flops)
        for sample in samples:
            if not 0 <= sample.start < sample.end <= len(flops):
                raise ValueError(
                    f"sample range [{sample.start}, {sample.end}) outside the {len(flops)}-layer model"
                )
        nets = []
        for k in range(count):
            torch.manual_seed(seed * 1000 + k)
            nets.append(DualStream(len(flops) + (1 if variant == "features" else 0), WIDTHS[variant]))
        predictor = cls(variant, flops, nets, _Norm(), list(samples), seed)
        predictor.norm = predictor._fit_norm(samples)
        predictor._train(samples, [], steps=STEPS[variant] if steps is None else steps, lr=2e-3)
        return predictor

    def _fit_norm(self, samples: Sequence[Sample]) -> _Norm:
        s, h, y = self._tensors(samples, _Norm())
        del s
        return _Norm(
            h_mean=float(h.mean()),
            h_std=float(h.std().clamp_min(1e-6)),
            y_mean=float(y.mean()),
            y_std=float(y.std().clamp_min(1e-6)),
        )

    # -- features --------------------------------------------------------------------------

    def _log_flops(self, start: int, end: int) -> float:
        return math.log(sum(self.layer_flops[start:end]) + _FLOPS_FLOOR)

    def _curve(self) -> tuple[np.ndarray, np.ndarray]:
        """The representative sub-models' ``log FLOPs``, ascending, and the order that sorts them."""
        cached = self.__dict__.get("_curve_cache")
        if cached is None:
            xs = np.array([self._log_flops(a, b) for a, b in representative(self.layer_flops)])
            order = np.argsort(xs, kind="stable")
            cached = (xs[order], order)
            self.__dict__["_curve_cache"] = cached
        return cached

    def _base(self, start: int, end: int, log_h: np.ndarray) -> float:
        """``log`` of the device's FLOPs interpolation (``features``): ``log h`` over ``log FLOPs`` of the
        representative sub-models, piecewise linear, flat beyond the ends."""
        xs, order = self._curve()
        return float(np.interp(self._log_flops(start, end), xs, log_h[order]))

    def _tensors(
        self, samples: Sequence[Sample], norm: _Norm
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Model inputs and normalised targets of ``samples``."""
        n = len(self.layer_flops)
        total = math.log(sum(self.layer_flops) + _FLOPS_FLOOR)
        s_rows, h_rows, ys = [], [], []
        logs: dict[tuple[float, ...], np.ndarray] = {}
        for x in samples:
            log_h = logs.get(x.h)
            if log_h is None:
                log_h = logs[x.h] = np.log(np.asarray(x.h, dtype=float))
            row = encode(x.start, x.end, n)
            target = math.log(x.seconds)
            if self.variant == "features":
                row.append(self._log_flops(x.start, x.end) / total)
                target -= self._base(x.start, x.end, log_h)
                h_rows.append(log_h - log_h.mean())
            else:
                h_rows.append(log_h)
            s_rows.append(row)
            ys.append(target)
        s = torch.tensor(s_rows, dtype=torch.float32)
        h = (torch.tensor(np.asarray(h_rows), dtype=torch.float32) - norm.h_mean) / norm.h_std
        y = (torch.tensor(ys, dtype=torch.float32) - norm.y_mean) / norm.y_std
        return s, h, y

    # -- training --------------------------------------------------------------------------

    def _train(self, data: Sequence[Sample], extra: Sequence[Sample], *, steps: int, lr: float) -> None:
        """Adam on mean squared error of the normalised log time; ``extra`` samples fill a quarter of
        every batch (the adaptive update's ``D^``). The ``features`` variant's pre-training (no ``extra``)
        decays the rate to zero on a cosine; the adaptive update keeps it constant."""
        s, h, y = self._tensors(data, self.norm) if data else self._tensors(extra, self.norm)
        if extra:
            es, eh, ey = self._tensors(extra, self.norm)
        for k, net in enumerate(self.nets):
            generator = torch.Generator().manual_seed(self.seed * 1000 + k + len(extra))
            optimiser = torch.optim.Adam(net.parameters(), lr=lr)
            decay = self.variant == "features" and not extra
            schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, steps) if decay else None
            net.train()
            for _ in range(steps):
                idx = torch.randint(len(y), (256,), generator=generator)
                bs, bh, by = s[idx], h[idx], y[idx]
                if extra:
                    jdx = torch.randint(len(ey), (64,), generator=generator)
                    bs, bh, by = torch.cat([bs, es[jdx]]), torch.cat([bh, eh[jdx]]), torch.cat([by, ey[jdx]])
                optimiser.zero_grad()
                loss = torch.nn.functional.mse_loss(net(bs, bh), by)
                loss.backward()
                optimiser.step()
                if schedule is not None:
                    schedule.step()
            net.eval()

    def adapt(self, samples: Sequence[Sample], *, steps: int = 300, lr: float = 5e-4) -> LatencyPredictor:
        """A copy trained on ``D`` plus ``samples`` (papers/004 Sec. 3.2 "Adaptive update"); self is kept."""
        if not samples:
            return self
        clone = copy.deepcopy(self)
        clone._train(clone.data, list(samples), steps=steps, lr=lr)
        return clone

    # -- prediction ------------------------------------------------------------------------

    def _outputs(self, ranges: Sequence[Range], h: Sequence[float]) -> torch.Tensor:
        """Log seconds per range, one row per ensemble member: shape (members, len(ranges))."""
        if len(h) != REPRESENTATIVES or not all(math.isfinite(v) and v > 0 for v in h):
            raise ValueError(f"h must be {REPRESENTATIVES} finite positive seconds, got {list(h)}")
        fake = [Sample(a, b, tuple(h), 1.0) for a, b in ranges]
        s, hv, _ = self._tensors(fake, self.norm)
        with torch.no_grad():
            out = torch.stack([net(s, hv) for net in self.nets]) * self.norm.y_std + self.norm.y_mean
        if self.variant == "features":
            log_h = np.log(np.asarray(h, dtype=float))
            base = torch.tensor([self._base(a, b, log_h) for a, b in ranges], dtype=torch.float32)
            out = out + base
        return out

    def predict(self, ranges: Sequence[Range], h: Sequence[float]) -> list[float]:
        """Predicted seconds of each range on the device with vector ``h`` (ensemble mean in log space)."""
        return [float(v) for v in torch.exp(self._outputs(ranges, h).mean(dim=0))]

    def spread(self, ranges: Sequence[Range], h: Sequence[float]) -> list[float]:
        """The ensemble's relative spread per range (0 for the single-network ``paper`` variant)."""
        return [float(v) for v in self._outputs(ranges, h).std(dim=0, unbiased=False)]

    def table(self, h: Sequence[float]) -> list[list[float]]:
        """Every contiguous range's predicted seconds as ``table[s][e - s - 1]`` (the DP's table shape)."""
        n = len(self.layer_flops)
        ranges = all_ranges(n)
        values = self.predict(ranges, h)
        out: list[list[float]] = [[] for _ in range(n)]
        for (a, _b), v in zip(ranges, values, strict=True):
            out[a].append(v)
        return out

    @property
    def num_layers(self) -> int:
        return len(self.layer_flops)


__all__ = ["STEPS", "VARIANTS", "WIDTHS", "DualStream", "LatencyPredictor", "Sample", "Variant"]
