"""The worker's ``h`` (papers/004 Sec. 3.2): measured when a ``Discover`` names the model, again when a
``characterise`` command asks, and remembered per model, batch size and emulated slowdown.

Measuring runs on the worker's own thread, bounded by ``characterise_budget`` seconds, with the torch
threads the worker is configured with: a run on this device waits meanwhile, and nothing else competes
for the CPU, so ``h`` is the device the pipeline sees. A slowdown change (``emulate``, a profile) needs a
new ``h``: the cache is keyed by the slowdown, so the old one is simply not used any more.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import torch

from edgeagent.config import CHARACTERISE_ROUNDS
from edgeagent.errors import ConfigError
from edgeagent.models import ModelSpec
from edgeagent.predictor.kinds import cpu_kind, unlearned_kind_warning
from edgeagent.predictor.machine import cpu_model
from edgeagent.predictor.measure import Characterisation, ModelLayers, characterise, model_key
from edgeagent.predictor.store import shipped_provenance
from edgeagent.predictor.submodels import REPRESENTATIVES

log = logging.getLogger(__name__)

Key = tuple[str, int, float]  # (model_key, batch size, slowdown)


class Characteriser:
    """A device's measured ``h``, one per (model, batch size, slowdown)."""

    def __init__(self, device_id: str, budget: float, *, rounds: int = CHARACTERISE_ROUNDS) -> None:
        if not budget > 0:
            raise ValueError(f"the characterise budget must be > 0 seconds, got {budget}")
        if rounds < 1:
            raise ValueError(f"the characterise rounds must be >= 1, got {rounds}")
        self.device_id = device_id
        self.budget = budget
        self.rounds = rounds
        self.cache: dict[Key, Characterisation] = {}
        self._last: tuple[str, int] | None = None  # (model_key, batch size) of the last h measured
        self._failed: set[str] = set()  # model requests that did not build (logged once each)
        self._kinds_checked: set[str] = set()  # model keys whose predictor's CPU kinds were compared

    def lookup(self, model: Mapping[str, Any], batch_size: int, slowdown: float) -> Characterisation | None:
        """The cached ``h`` of this model at this batch size and slowdown, if any (never measures)."""
        try:
            spec = ModelSpec.from_dict(model)
        except Exception:  # a bad spec has no h; measure() says why
            return None
        return self.cache.get((model_key(spec), batch_size, slowdown))

    def latest(self, slowdown: float) -> Characterisation | None:
        """The ``h`` of the model measured last, at ``slowdown`` (None if not measured at that slowdown)."""
        if self._last is None:
            return None
        return self.cache.get((*self._last, slowdown))

    def measure(
        self,
        model: Mapping[str, Any],
        batch_size: int,
        *,
        slowdown: float,
        threads: int,
        fresh: bool = False,
    ) -> Characterisation:
        """``h`` of ``model`` at ``batch_size``: from the cache unless ``fresh``, else measured now.

        Logs and raises :class:`ConfigError` naming the model when it cannot be built or run (an unknown
        model, bad options, a user model that fails): whatever the model does, the worker goes on. A
        request that failed before is logged again only at debug level (discovery repeats itself).
        """
        request = json.dumps(dict(model), sort_keys=True, default=str) + f"@{batch_size}"
        name = model.get("name", "?")
        try:
            spec = ModelSpec.from_dict(model)
            key: Key = (model_key(spec), batch_size, slowdown)
            cached = self.cache.get(key)
            if cached is not None and not fresh:
                self._last = key[:2]
                return cached
            previous = torch.get_num_threads()
            torch.set_num_threads(threads)
            try:
                layers = ModelLayers.build(spec, batch_size)
                measured = characterise(layers, budget=self.budget, slowdown=slowdown, rounds=self.rounds)
            finally:
                torch.set_num_threads(previous)
        except Exception as exc:  # anything a model spec or a user's model function may raise
            level = logging.DEBUG if request in self._failed and not fresh else logging.ERROR
            self._failed.add(request)
            reason = f"cannot measure h for model {name!r} at batch {batch_size}: {exc}"
            log.log(level, "%s: %s", self.device_id, reason)
            raise ConfigError(reason) from exc
        self._failed.discard(request)
        self._warn_on_unlearned_kind(spec, key[0])
        self.cache[key] = measured
        self._last = key[:2]
        log.info("%s", describe(self.device_id, spec.name, measured))
        return measured

    def _warn_on_unlearned_kind(self, spec: ModelSpec, key: str) -> None:
        """Once per model: warn when the shipped predictor never saw this device's CPU kind (an ARM Pi
        against the x86 data it ships with). Here, not on the central node: only the device knows its
        CPU, and this ``h`` is measured only for a run with ``--estimator predictor``."""
        if key in self._kinds_checked:
            return
        self._kinds_checked.add(key)
        provenance = shipped_provenance(spec)
        if provenance is None:
            return  # no predictor for this model: the central node says so and plans by capacity
        warning = unlearned_kind_warning(
            provenance,
            model=spec.name,
            in_shape=spec.in_shape,
            classes=spec.num_classes,
            kind=cpu_kind(),
            cpu=cpu_model(),
        )
        if warning:
            log.warning("%s: %s", self.device_id, warning)


def describe(device_id: str, model_name: str, h: Characterisation) -> str:
    """The log line of one measurement."""
    count = f"{len(h.h)} sub-models" if h.complete else f"{len(h.h)} of {REPRESENTATIVES} sub-models"
    if h.h:
        count += f", {1e3 * min(h.h):.1f}-{1e3 * max(h.h):.1f} ms"
    if h.tiles:
        count += f"; {len(h.tiles)} tiles"
    return f"{device_id}: measured h for {model_name} at batch {h.batch_size} in {h.seconds:.2f} s ({count})"


def announced(h: Characterisation | None) -> dict[str, Any]:
    """The ``Announce`` fields of ``h`` (none: the defaults, not measured)."""
    if h is None:
        return {}
    fields = {"h": list(h.h), "h_key": h.key, "h_batch": h.batch_size, "h_seconds": h.seconds}
    return {**fields, "tiles": list(h.tiles)}


__all__ = ["Characteriser", "announced", "describe"]
