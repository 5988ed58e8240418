"""How the central node knows a device's speed (papers/004 Sec. 3.2 against papers/000 eq. 1-3).

``--estimator predictor`` (AccEPT): every worker announces ``h`` for the run's model and batch size when
it is discovered, so the **first** split already uses predicted times per device (eq. 10) instead of an
equal split. During the run the stage times that ride with the gradients are compared with the
prediction (:class:`edgeagent.predictor.tracker.DeviceTimes`): beyond ``--epsilon`` the device is asked
to measure ``h`` again (``Characterise``); every measured time is a sample of the adaptive update,
which the planning job runs before it plans. ``--estimator capacity`` is FTPipeHD's estimate, the
baseline; a model without a trained predictor falls back to it, with a log line that says how to build
one.
"""

from __future__ import annotations

import logging
import statistics
import time

from edgeagent.modes.pipeline.central.context import RunState
from edgeagent.predictor.correction import TileFit
from edgeagent.predictor.measure import model_key, model_tiling
from edgeagent.predictor.store import shipped, shipped_path
from edgeagent.predictor.tracker import DeviceTimes, Drift
from edgeagent.protocol.commands import Characterise
from edgeagent.protocol.messages import Announce
from edgeagent.protocol.topics import Family

log = logging.getLogger("edgeagent.roles.central")

GAP_RECHECKS = 3  # extra plan checks in a row after re-plans for a standing gap (_schedule_recheck)

RangeTables = tuple[tuple[tuple[float, ...], ...] | None, ...]


def _correction_note(weight: float | None, fit: TileFit | None) -> str:
    """What the log line of a device's ``h`` says of its correction."""
    if fit is not None:
        low, high = min(fit.scales), max(fit.scales)
        return f"; fitted: {1e3 * fit.overhead:.2f} ms per sub-model, tiles {low:.2f}-{high:.2f}x predicted"
    if weight is not None:
        return f"; corrected {weight:.0%} per layer, {1 - weight:.0%} by tiles summed"
    return ""


class Estimation:
    """The latency predictor's state in a run: ``self.device_times`` (None: FTPipeHD's capacity)."""

    def __init__(self, state: RunState) -> None:
        self.state = state

    def load_device_times(self) -> DeviceTimes | None:
        """The run's predictor with every worker's announced ``h``, or None for the capacity estimate."""
        state = self.state
        state.h_changed = False  # a device's h changed since the last plan (set by on_h)
        if state.config.estimator != "predictor" or state.config.partition != "dynamic":
            return None
        try:
            predictor = shipped(state.spec)
        except ValueError as exc:
            log.warning("latency predictor unusable (%s); planning with FTPipeHD's capacity estimate", exc)
            return None
        if predictor is None:
            log.warning(
                "no latency predictor for model %s (key %s, looked for %s); planning with FTPipeHD's "
                "capacity estimate. Build one: `edgeagent predictor collect --model %s` then "
                "`edgeagent predictor train`",
                state.spec.name,
                model_key(state.spec),
                shipped_path(state.spec),
                state.spec.name,
            )
            return None
        if predictor.num_layers != len(state.param_bytes):
            log.warning(
                "the latency predictor has %d layers, the model %d: not used",
                predictor.num_layers,
                len(state.param_bytes),
            )
            return None
        times = DeviceTimes(
            predictor,
            epsilon=state.config.epsilon,
            drift=state.config.drift_rule,
            correction=state.config.correction,
            tiling=model_tiling(state.spec, predictor.layer_flops),
        )
        for device in state.worker_list[1:]:
            self._take_h(times, state.announced.get(device))
        missing = [d for d in state.worker_list[1:] if not times.known(d)]
        if missing:
            log.warning("no h from %s: planned as equal devices until they have run", ", ".join(missing))
        return times

    def _take_h(self, times: DeviceTimes, msg: Announce | None) -> bool:
        """Take a device's ``h`` if it was measured for this run's model and batch size."""
        state = self.state
        if msg is None or msg.h_key != model_key(state.spec) or msg.h_batch != state.train.batch_size:
            return False
        if not times.set_h(msg.device_id, msg.h, msg.tiles):
            return False
        if msg.tiles and not times.tiles.get(msg.device_id):
            log.warning(
                "%s announced %d tile times that do not fit this model's tiling (need %d finite times > 0): "
                "its predicted times go uncorrected (is the worker's edgeagent the same version?)",
                msg.device_id,
                len(msg.tiles),
                len(times.tiling),
            )
        times.table(msg.device_id)  # corrects it now: the blend's weight or the fit is known from here on
        weight = times.blend_weights.get(msg.device_id)
        fit = times.fits.get(msg.device_id)
        state.characterisations.append(
            {
                "device": msg.device_id,
                "h": [round(v, 6) for v in msg.h],
                "tiles": [round(v, 6) for v in times.tiles.get(msg.device_id, ())],
                "blend": weight,
                "overhead": None if fit is None else round(fit.overhead, 6),
                "tile_factors": None if fit is None else [round(v, 4) for v in fit.scales],
                "seconds": round(msg.h_seconds, 3),
                "batch": len(state.report.timeline) if state.train_started else 0,
            }
        )
        log.info(
            "%s: h %.1f-%.1f ms, %d tiles (measured in %.1f s)%s",
            msg.device_id,
            1e3 * min(msg.h),
            1e3 * max(msg.h),
            len(times.tiles.get(msg.device_id, ())),
            msg.h_seconds,
            _correction_note(weight, fit),
        )
        return True

    def range_times(self, workers: list[str]) -> RangeTables | None:
        """Per stage of ``workers``: the predictor's table of the device (None: the central node, whose own
        profile is eq. 9's ``T^0``, and devices without ``h``, planned by their capacity)."""
        times = self.state.device_times
        if times is None:
            return None
        tables: list[tuple[tuple[float, ...], ...] | None] = [None]
        for device in workers[1:]:
            table = times.table(device)
            tables.append(None if table is None else tuple(tuple(row) for row in table))
        return tuple(tables) if any(t is not None for t in tables) else None

    def first_cap(self, device: str) -> float:
        """A device's capacity before it ran (the hybrid planner's per-device speed): with the predictor,
        its predicted time of the whole model over the central node's profile (the central node: its own
        emulated slowdown); otherwise equal devices."""
        state = self.state
        times = state.device_times
        if times is None:
            return 1.0
        if device == state.device_id:
            return state.config.slowdown
        whole = times.predict(device, 0, len(state.profile.seconds))
        reference = sum(state.profile.seconds)
        return whole / reference if whole is not None and reference > 0 else 1.0

    def replan_due(self, joiners: list[str]) -> bool:
        """Whether a plan check runs the DP. FTPipeHD (capacity): always. AccEPT (papers/004 Sec. 3.2): the
        split is recomputed when a device's ``h`` was measured again (after a drift beyond epsilon), a
        device joins, or a device's steady stage time stands beyond epsilon of its prediction (a standing
        gap, :meth:`DeviceTimes.close_gaps`); between those the predictor has nothing new to say, and
        re-planning on measured times moves layers back and forth on noise (measured: 0.57x the oracle
        against 0.87x)."""
        state = self.state
        if state.device_times is None or joiners or state.h_changed or state.device_times.gaps:
            state.h_changed = False
            return True
        return False

    def schedule_recheck(self, done: int, gap: bool) -> None:
        """After a re-plan for a standing gap, check the new split again ``2 * repartition_first`` batches
        later instead of ``repartition_every``: the rescale took one measured range per device, and the
        new split's ranges show within a few batches whether it holds (seen: a worker 10x slower than its
        h, rescaled at batch 10 to the first of its ranges, waited until batch 110 for the second). At most
        ``GAP_RECHECKS`` in a row, so noise cannot keep the pipeline re-planning."""
        state = self.state
        if gap and state.rechecks < GAP_RECHECKS:
            state.rechecks += 1
            state.recheck_at = done + 2 * state.policy.first
        else:
            if not gap:
                state.rechecks = 0
            state.recheck_at = None

    def measuring_until(self, now: float) -> float:
        """Until when (monotonic) a requested ``h`` measurement may hold the pipeline up (``now`` or
        earlier: none does); windows that have passed are forgotten."""
        state = self.state
        for device in [d for d, until in state.measuring.items() if until <= now]:
            del state.measuring[device]
        return max(state.measuring.values(), default=now)

    def contention(self) -> float:
        """How much slower stage 0 runs in the pipeline than its profile says (>= 1 on a shared machine:
        every process of an emulated cluster competes for the same cores). Measured stage times are
        divided by it before they become samples of the adaptive update, so that the predictor learns
        devices, not this machine's load, and stays comparable with eq. 9's profile of stage 0."""
        state = self.state
        own = state.runner.recent
        profiled = sum(state.profile.seconds[state.points[0] : state.points[1]]) * state.config.slowdown
        if not own or profiled <= 0:
            return 1.0
        return max(1.0, sum(own) / len(own) / profiled)

    def steady_stage_times(self) -> list[float]:
        """Every worker's stage time as the median over the last gradients (``DRIFT_HISTORY``) of this
        split, not the latest alone: a time beyond epsilon for a few batches is not a changed device
        (seen: +85 % in one plan check late in a run, from a transient, and a measurement of ``h`` that
        stalled the stage for nothing: 0.8x the run's samples/s). A change that lasts shows once it
        holds for more than half of them. Empty when no gradient of this split carried them all."""
        stages = len(self.state.worker_list) - 1
        rows = [row for row in self.state.stage_history if len(row) == stages]
        if stages < 1 or not rows:
            return []
        return [statistics.median(row[k] for row in rows) for k in range(stages)]

    def stage_time_pairs(self) -> dict[str, dict[str, float]]:
        """Each worker's stage time, predicted (the latency predictor's, for its layers of the current split)
        and measured (:meth:`steady_stage_times`), in seconds per batch: the report's devices. Empty with
        FTPipeHD's capacity estimator, which predicts no times of its own."""
        state = self.state
        times, steady = state.device_times, self.steady_stage_times()
        if times is None or not steady or len(state.points) != len(state.worker_list) + 1:
            return {}  # (hybrid stages: several devices to a stage, no one device's stage time)
        out: dict[str, dict[str, float]] = {}
        for k, device in enumerate(state.worker_list[1:], start=1):
            predicted = times.predict(device, state.points[k], state.points[k + 1])
            if predicted is not None:
                out[device] = {"predicted_stage_s": predicted, "measured_stage_s": steady[k - 1]}
        return out

    def observe_stage_times(self, batches_left: int) -> None:
        """Dynamic prediction: compare every worker's steady stage time (:meth:`steady_stage_times`) with
        its prediction; beyond epsilon (see :meth:`DeviceTimes.observe`), ask the device for a new ``h``
        where that can pay (:meth:`_h_pays`) in the ``batches_left`` of the run."""
        state = self.state
        times = state.device_times
        steady = self.steady_stage_times()
        if times is None or not steady:
            return
        load = self.contention()
        typical = sum(steady) / len(steady) / load
        for k, device in enumerate(state.worker_list[1:], start=1):
            start, end = state.points[k], state.points[k + 1]
            drift = times.observe(device, start, end, steady[k - 1], scale=typical, load=load)
            if device in times.gaps:
                predicted = times.predict(device, start, end) or 0.0
                alone = steady[k - 1] / load
                log.info(
                    "%s: stage [%d, %d) takes %.1f ms in the pipeline (%.1f ms over the load %.2f), %+.0f %% "
                    "off the predicted %.1f ms (epsilon %.0f %%), with the same h: the next plan rescales "
                    "this device's predicted times",
                    device,
                    start,
                    end,
                    1e3 * steady[k - 1],
                    1e3 * alone,
                    load,
                    100 * (alone / predicted - 1) if predicted > 0 else 0.0,
                    1e3 * predicted,
                    100 * times.epsilon,
                )
                state.event("gap", device=device, measured=alone, predicted=predicted)
            if drift is None or not self._h_pays(drift, max(0, batches_left) * max(steady)):
                continue
            log.info(
                "%s: stage time %.1f ms is %+.0f %% off the predicted %.1f ms (epsilon %.0f %%): asking "
                "it to measure h again",
                device,
                1e3 * drift.measured,
                100 * drift.error,
                1e3 * drift.predicted,
                100 * times.epsilon,
            )
            state.event("drift", device=device, measured=drift.measured, predicted=drift.predicted)
            self.ask_h(device, slower=drift.measured / drift.predicted if drift.predicted > 0 else 1.0)

    def _h_pays(self, drift: Drift, left: float) -> bool:
        """Whether measuring ``h`` again can pay for the stall it costs (ours, under the ``changed`` drift
        rule; the paper's rule always asks). The device's stage stops for about as long as its last
        measurement took, and a re-plan can save at most :attr:`Drift.recoverable` of the ``left``
        seconds of the run (the batches left at the current step). Late in a run that is less than the
        stall (seen: a drift at batch 210 of 225 stopped a stage for 9.6 s of a 30 s run, 0.67x the
        oracle's samples/s; without the stall 0.9x)."""
        state = self.state
        times = state.device_times
        last = state.announced.get(drift.device)
        if times is None or times.drift == "paper" or last is None:
            return True
        saved = left * drift.recoverable
        if last.h_seconds <= saved:
            return True
        log.info(
            "%s: stage time %.1f ms is %+.0f %% off the predicted %.1f ms, but measuring h again would stop "
            "its stage for about %.1f s and a new split could save at most %.1f s of the %.1f s left: "
            "not asked",
            drift.device,
            1e3 * drift.measured,
            100 * drift.error,
            1e3 * drift.predicted,
            last.h_seconds,
            saved,
            left,
        )
        state.event("drift_ignored", device=drift.device, measured=drift.measured, predicted=drift.predicted)
        return False

    def ask_h(self, device: str, *, slower: float = 1.0) -> None:
        """Ask ``device`` to measure its ``h`` for this run's model (a drift, or a device that joins);
        ``slower``: how much slower than predicted it now runs (its measurement takes that much longer)."""
        state = self.state
        if state.device_times is None:
            return
        state.send(
            state.topics.fixed(Family.COMMAND),
            Characterise(
                run_id=state.run_id,
                device=device,
                model=state.spec.to_dict(),
                batch_size=state.train.batch_size,
            ),
        )
        if device not in state.worker_list:
            return  # a joiner: no batch waits for it
        # The device's stage stops while it measures: the batches in flight wait (Deadlines.measurement).
        last = state.announced.get(device)
        took = last.h_seconds if last is not None else 0.0
        allowance = state.deadlines.measurement(took * max(1.0, slower))
        state.measuring[device] = time.monotonic() + allowance
        log.info("%s measures h (may take up to %.1f s; batch timers wait for it)", device, allowance)

    def adapt_predictor(self) -> None:
        """The adaptive update, on the planning job's thread (papers/004 Sec. 3.2), before a re-plan: the
        plan is what uses the adapted predictor. (Adapting at every plan check, as first built, cost about
        1 s of this process's processor each time, beside stage 0 on the same cores: 0.82-0.86x the
        oracle's samples/s where the same split without it reached 0.95-1.03x. Drift detection does not
        need it under the ``changed`` rule, which compares a device with its own last time.)

        Under the ``rescale`` rule (opt-in) a standing gap is closed by rescaling the device's times
        (:meth:`DeviceTimes.close_gaps`) instead: fine-tuned on a few stage times measured in a busy
        pipeline, the net moved other ranges' predictions by up to 6x from one plan to the next (a worker
        10x slower than its h: five re-plans and 195-220 samples/s, against three and 370 with the
        rescale alone; the oracle 578-636)."""
        times = self.state.device_times
        if times is None:
            return
        started = time.perf_counter()
        # A standing gap is answered by its rescale alone (the net fine-tuned on it moved other ranges).
        used = times.adapt() if times.drift != "rescale" and not times.gaps else 0
        if used:
            took = time.perf_counter() - started
            log.info("latency predictor adapted on %d measured samples in %.2f s", used, took)
            self.state.report.adaptations.append({"samples": used, "seconds": round(took, 3)})
        for device, (factor, scale) in times.close_gaps().items():
            log.info(
                "%s: its stage time stands %+.0f %% off the prediction: its predicted times are scaled by "
                "%.2f (x%.2f in all) for this plan",
                device,
                100 * (factor - 1),
                factor,
                scale,
            )

    def on_h(self, msg: Announce) -> None:
        """A device announced a new ``h`` (after ``Characterise``, or a joiner): the next plan uses it."""
        state = self.state
        if msg.device_id in state.measuring:
            # Its stage runs again: the batches that waited for it get a whole batch deadline from now.
            state.measuring[msg.device_id] = time.monotonic() + state.batch_deadline
        if state.device_times is not None and self._take_h(state.device_times, msg):
            state.h_changed = bool(state.train_started)  # the next plan check re-plans (see _replan_due)
            state.event("characterised", device=msg.device_id, h=list(msg.h), seconds=msg.h_seconds)
