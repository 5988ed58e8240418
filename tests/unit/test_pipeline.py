"""Schedule and stash bookkeeping, without a broker."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import pytest
import torch

from edgeagent.errors import TrainingError
from edgeagent.models import ModelSpec, build_layers, build_model
from edgeagent.pipeline.schedule import (
    Action,
    Kind,
    admit,
    next_kind,
    one_f_one_b,
    simulate,
    stage_bound,
    validate,
)
from edgeagent.pipeline.stage import Stage, StageModule
from edgeagent.protocol.options import TrainOptions

SPEC = ModelSpec("cnn", (1, 8, 8), 10)
POINTS = [0, 2, 4, 8]


def make_stages(options: TrainOptions, points: list[int] = POINTS, *, window: int = 1) -> list[Stage]:
    n = len(points) - 1
    stages = []
    for i in range(n):
        layers = build_layers(SPEC, points[i], points[i + 1], seed=0)
        module = StageModule({points[i] + k: layer for k, layer in enumerate(layers)})
        stages.append(Stage(module, options, is_first=i == 0, is_last=i == n - 1, aggregation_window=window))
    return stages


def drive(stages: list[Stage], xs: torch.Tensor, ys: torch.Tensor, in_flight: int) -> dict[int, int]:
    """Run the 1F1B schedule over in-process stages; return the version each batch was forwarded with."""
    n, batches = len(stages), xs.shape[0]
    schedule = one_f_one_b(n, batches, in_flight)
    acts: dict[tuple[int, int], torch.Tensor] = {}
    grads: dict[tuple[int, int], torch.Tensor | None] = {}
    versions: dict[int, int] = {}
    pos = [0] * n
    remaining = sum(len(v) for v in schedule.values())
    while remaining:
        progressed = False
        for s in range(n):
            while pos[s] < len(schedule[s]):
                a = schedule[s][pos[s]]
                if a.kind == "F":
                    if s == 0:
                        out, versions[a.batch] = stages[0].forward(a.batch, xs[a.batch])
                    elif (s - 1, a.batch) in acts:
                        out, _ = stages[s].forward(a.batch, acts[(s - 1, a.batch)], versions[a.batch])
                    else:
                        break
                    acts[(s, a.batch)] = out
                else:
                    if s == n - 1:
                        r = stages[s].backward(a.batch, labels=ys[a.batch])
                    elif (s + 1, a.batch) in grads:
                        r = stages[s].backward(a.batch, grad_output=grads[(s + 1, a.batch)])
                    else:
                        break
                    grads[(s, a.batch)] = r.grad_input
                pos[s] += 1
                remaining -= 1
                progressed = True
        assert progressed, "schedule deadlocked"
    return versions


def stale_sgd_reference(
    xs: torch.Tensor, ys: torch.Tensor, versions: dict[int, int], lr: float
) -> dict[str, torch.Tensor]:
    """w_{t+1} = w_t - lr * grad(w_{version(t)}) on the unsplit model: PipeDream's update rule."""
    history = [copy.deepcopy(build_model(SPEC, seed=0).state_dict())]
    for b in range(xs.shape[0]):
        model = build_model(SPEC, seed=0)
        model.load_state_dict(history[versions[b]])
        torch.nn.functional.cross_entropy(model(xs[b]), ys[b]).backward()
        new = {k: v.clone() for k, v in history[-1].items()}
        for name, p in model.named_parameters():
            assert p.grad is not None
            new[name] -= lr * p.grad
        history.append(new)
    return history[-1]


def merged_state(stages: list[Stage]) -> dict[str, torch.Tensor]:
    return {k.removeprefix("layers."): v for s in stages for k, v in s.module.state_dict().items()}


@pytest.mark.parametrize("in_flight", [1, 2, 3, 5])
def test_pipeline_matches_stale_sgd(in_flight: int) -> None:
    torch.manual_seed(0)
    xs, ys = torch.randn(9, 4, 1, 8, 8), torch.randint(0, 10, (9, 4))
    stages = make_stages(TrainOptions(learning_rate=0.1))
    versions = drive(stages, xs, ys, in_flight)
    # Vertical sync: batch b was forwarded with the version after b - in_flight + 1 updates.
    assert versions == {b: max(0, b - in_flight + 1) for b in range(9)}
    expected = stale_sgd_reference(xs, ys, versions, lr=0.1)
    got = merged_state(stages)
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value)


def test_stash_is_bounded_and_pruned() -> None:
    torch.manual_seed(0)
    xs, ys = torch.randn(12, 4, 1, 8, 8), torch.randint(0, 10, (12, 4))
    stages = make_stages(TrainOptions(learning_rate=0.1))
    drive(stages, xs, ys, in_flight=3)
    for stage in stages:
        assert stage.in_flight == []
        assert stage.version == 12
        # Only versions a future batch may still ask for survive: the newest ones.
        assert len(stage.stashed_versions) <= 3 + 1
        assert stage.stashed_versions[-1] == 12


def test_stash_does_not_alias_live_weights() -> None:
    stage = make_stages(TrainOptions(learning_rate=0.5), [0, 8])[0]
    x, y = torch.randn(4, 1, 8, 8), torch.randint(0, 10, (4,))
    before = {k: v.clone() for k, v in stage.module.named_parameters()}
    stage.forward(0, x)
    stage.forward(1, x)  # forwarded with version 0 too
    stage.backward(0, labels=y)  # updates live weights in place
    stage.backward(1, labels=y)  # must still see version 0, and autograd must not complain
    assert stage.version == 2
    changed = any(not torch.equal(before[k], v) for k, v in stage.module.named_parameters())
    assert changed


def test_unknown_version_and_batch_raise() -> None:
    stages = make_stages(TrainOptions(learning_rate=0.1))
    with pytest.raises(TrainingError, match="version 7"):
        stages[1].forward(0, torch.randn(4, 8, 4, 4), version=7)
    with pytest.raises(TrainingError, match="not in flight"):
        stages[2].backward(3, labels=torch.zeros(4, dtype=torch.long))
    _out, _ = stages[1].forward(0, torch.randn(4, 8, 4, 4), version=0)
    with pytest.raises(TrainingError, match="shape"):
        stages[1].backward(0, grad_output=torch.zeros(1, 2))


def test_drop_in_flight_forgets_batches() -> None:
    stage = make_stages(TrainOptions(learning_rate=0.1), [0, 8])[0]
    stage.forward(0, torch.randn(2, 1, 8, 8))
    stage.drop_in_flight()
    assert stage.in_flight == []
    with pytest.raises(TrainingError):
        stage.backward(0, labels=torch.zeros(2, dtype=torch.long))


def test_aggregation_averages_the_window() -> None:
    torch.manual_seed(0)
    xs, ys = torch.randn(6, 4, 1, 8, 8), torch.randint(0, 10, (6, 4))
    plain = make_stages(TrainOptions(learning_rate=0.1), [0, 8])[0]
    agg = make_stages(TrainOptions(learning_rate=0.1, staleness="aggregate"), [0, 8], window=3)[0]
    snapshots = []
    for b in range(3):
        for stage in (plain, agg):
            stage.forward(b, xs[b])
            stage.backward(b, labels=ys[b])
        snapshots.append({k: v.detach().clone() for k, v in plain.module.named_parameters()})
    # After 3 = window updates the aggregated stage holds the mean of the three versions.
    for name, p in agg.module.named_parameters():
        torch.testing.assert_close(p.detach(), torch.stack([s[name] for s in snapshots]).mean(0))
    assert agg.version == plain.version == 3


def test_aggregation_off_or_window_one_changes_nothing() -> None:
    torch.manual_seed(0)
    xs, ys = torch.randn(4, 4, 1, 8, 8), torch.randint(0, 10, (4, 4))
    a = make_stages(TrainOptions(learning_rate=0.1), [0, 8])[0]
    b = make_stages(TrainOptions(learning_rate=0.1, staleness="aggregate"), [0, 8], window=1)[0]
    for i in range(4):
        for stage in (a, b):
            stage.forward(i, xs[i])
            stage.backward(i, labels=ys[i])
    for (_, pa), (_, pb) in zip(a.module.named_parameters(), b.module.named_parameters(), strict=False):
        assert torch.equal(pa, pb)


# -- schedule ------------------------------------------------------------------------------------


def test_action_string_form_round_trips() -> None:
    assert str(Action(1, "F", 0)) == "1F0"
    assert Action.parse("12B7") == Action(12, "B", 7)
    with pytest.raises(ValueError):
        Action.parse("1X0")


@pytest.mark.parametrize(
    ("stages", "batches", "bound"), [(1, 5, 1), (3, 8, 3), (3, 8, 1), (4, 10, 2), (3, 2, 5)]
)
def test_generated_schedules_validate(stages: int, batches: int, bound: int) -> None:
    validate(one_f_one_b(stages, batches, bound), stages, batches, bound)


def test_validate_rejects_broken_schedules() -> None:
    s = one_f_one_b(3, 4, 3)
    bad = {k: list(v) for k, v in s.items()}
    bad[1] = [a for a in bad[1] if a != Action(1, "F", 2)]
    with pytest.raises(ValueError, match="stage 1 does F"):
        validate(bad, 3, 4)
    swapped = {k: list(v) for k, v in s.items()}
    swapped[2][0], swapped[2][1] = swapped[2][1], swapped[2][0]
    with pytest.raises(ValueError, match="before its forward"):
        validate(swapped, 3, 4)
    with pytest.raises(ValueError, match="in flight"):
        validate(s, 3, 4, in_flight=2)


def test_simulate_detects_deadlock() -> None:
    s = one_f_one_b(2, 2, 2)
    # Stage 1 wants to backward batch 0 before it has forwarded it: it waits forever.
    s[1] = [Action(1, "B", 0), Action(1, "F", 0), Action(1, "F", 1), Action(1, "B", 1)]
    with pytest.raises(ValueError, match="deadlock"):
        simulate(s, [1, 1], [1, 1])


def test_pipelining_overlaps_three_equal_stages() -> None:
    n = 120
    pipelined = simulate(one_f_one_b(3, n, 3), [1, 1, 1], [2, 2, 2])
    serial = simulate(one_f_one_b(3, n, 1), [1, 1, 1], [2, 2, 2])
    assert serial.makespan / pipelined.makespan == pytest.approx(3.0, rel=0.05)


def test_next_kind_alternates() -> None:
    assert next_kind(None, True, True) == "B"
    assert next_kind("B", True, True) == "F"
    assert next_kind("F", True, True) == "B"
    assert next_kind("F", True, False) == "F"
    assert next_kind("B", False, True) == "B"
    assert next_kind(None, False, False) is None


# -- the runtime's two rules against the schedule as data -----------------------------------------


def run_rules(
    num_stages: int,
    num_batches: int,
    bound: int,
    forward_time: Sequence[int],
    backward_time: Sequence[int],
    comm_time: int = 0,
) -> tuple[dict[int, list[Action]], int]:
    """What each stage executes when driven only by ``admit`` and ``next_kind``; and the makespan.

    A stage may forward its next batch once it is there (stage 0: always) and while
    ``admit(batches in flight on it, stage_bound(bound, s))`` (the last stage: always). A stage may
    backward its next batch once its gradient has arrived; the last stage once it has forwarded it (the
    labels are there, as on a worker). Batches go in order each way. An idle stage asks
    ``next_kind``. Time is in whole ticks and every step takes at least one, so what the stages choose
    at one tick cannot change each other's choices at that tick.
    """
    n = num_stages
    order: dict[int, list[Action]] = {s: [] for s in range(n)}
    free_at = [0] * n
    last: list[Kind | None] = [None] * n
    next_f, next_b = [0] * n, [0] * n
    activation_at: list[dict[int, int]] = [{} for _ in range(n)]  # batch -> tick its input arrives
    gradient_at: list[dict[int, int]] = [{} for _ in range(n)]  # batch -> tick its backward may start
    t = makespan = 0
    while any(b < num_batches for b in next_b):
        for s in range(n):
            if free_at[s] > t:
                continue
            arrived = next_f[0] < num_batches if s == 0 else activation_at[s].get(next_f[s], t + 1) <= t
            held = next_f[s] - next_b[s]
            forward_ready = arrived and (s == n - 1 or admit(held, stage_bound(bound, s)))
            backward_ready = gradient_at[s].get(next_b[s], t + 1) <= t
            kind = next_kind(last[s], forward_ready, backward_ready)
            if kind is None:
                continue
            if kind == "F":
                b, end = next_f[s], t + forward_time[s]
                next_f[s] += 1
                if s < n - 1:
                    activation_at[s + 1][b] = end + comm_time
                else:
                    gradient_at[s][b] = end
            else:
                b, end = next_b[s], t + backward_time[s]
                next_b[s] += 1
                if s > 0:
                    gradient_at[s - 1][b] = end + comm_time
            order[s].append(Action(s, kind, b))
            last[s], free_at[s] = kind, end
            makespan = max(makespan, end)
        t += 1
        assert t < 100_000, "the rules deadlocked"
    return order, makespan


def _timings(n: int) -> dict[str, tuple[list[int], list[int], int]]:
    """(forward ticks, backward ticks, link ticks) per stage for a pipeline of ``n`` stages."""
    return {
        "equal": ([1] * n, [2] * n, 0),
        "equal, slow links": ([1] * n, [2] * n, 1),
        "equal, F = B": ([1] * n, [1] * n, 0),
        "last stage 3x": ([1] * (n - 1) + [3], [2] * (n - 1) + [6], 0),
        "first stage 3x": ([3] + [1] * (n - 1), [6] + [2] * (n - 1), 1),
    }


# (stages, batches, bound) where the rules give one_f_one_b's order, whatever the timing
RULES_AGREE = [(1, 5, 1), (2, 6, 1), (2, 6, 2), (2, 1, 2), (3, 8, 1), (4, 10, 1), (5, 12, 1)]
# ... where they give it with equal stages (the demo's 3 devices with the default bound 3 among them;
# with unequal stages a backward that arrives early is taken early: a valid order, not this one)
RULES_AGREE_EQUAL = [(3, 8, 2), (3, 8, 3), (4, 10, 2), (4, 10, 4), (5, 12, 5), (5, 12, 3)]
# ... and where they do not: more in flight than stages
RULES_DIFFER = [(1, 5, 2), (2, 6, 3), (3, 8, 5)]
RULES_DIFFER_REASON = (
    "with more batches in flight than stages the last stage, whose backward is ready as soon as its "
    "forward is done, never warms up past 1 (one_f_one_b: bound - stages + 1)"
)
EQUAL = ("equal", "equal, slow links", "equal, F = B")


def _rule_cases() -> list[object]:
    cases: list[object] = []
    for agree, group in ((True, RULES_AGREE), (True, RULES_AGREE_EQUAL), (False, RULES_DIFFER)):
        for n, batches, bound in group:
            for name in _timings(n):
                if group is not RULES_AGREE and name not in EQUAL:
                    continue  # an unequal pipeline can make the rules agree by chance: not a strict xfail
                marks = () if agree else (pytest.mark.xfail(strict=True, reason=RULES_DIFFER_REASON),)
                cases.append(
                    pytest.param(n, batches, bound, name, marks=marks, id=f"{n}-{batches}-{bound}-{name}")
                )
    return cases


@pytest.mark.parametrize(("stages", "batches", "bound", "timing"), _rule_cases())
def test_rules_reproduce_one_f_one_b(stages: int, batches: int, bound: int, timing: str) -> None:
    forward, backward, comm = _timings(stages)[timing]
    order, _ = run_rules(stages, batches, bound, forward, backward, comm)
    expected = one_f_one_b(stages, batches, bound)
    for s in range(stages):
        assert [str(a) for a in order[s]] == [str(a) for a in expected[s]], f"stage {s}"


@pytest.mark.parametrize(("stages", "batches", "bound"), RULES_AGREE + RULES_AGREE_EQUAL + RULES_DIFFER)
def test_rule_driven_orders_validate_and_simulate(stages: int, batches: int, bound: int) -> None:
    """Whatever order the rules produce is a valid schedule, and the offline simulator, replaying it
    with the same step and link times, finishes exactly when the rules did."""
    for forward, backward, comm in _timings(stages).values():
        order, makespan = run_rules(stages, batches, bound, forward, backward, comm)
        validate(order, stages, batches, bound)
        assert simulate(order, forward, backward, comm).makespan == makespan


def test_switch_accepts_layers_without_tensors() -> None:
    """Pooling and flatten layers have no tensors; fetching them must still complete."""
    from edgeagent.models import num_layers
    from edgeagent.pipeline.build import make_stage
    from edgeagent.protocol.messages import Repartition
    from edgeagent.protocol.options import TrainOptions
    from edgeagent.replication.store import WeightStore
    from edgeagent.replication.switch import Switch, serve_fetch

    spec = ModelSpec("cnn", (1, 8, 8), 10)  # layers 1, 3, 5 are max-pools: no parameters
    total = num_layers(spec)
    owner_stage = make_stage(
        spec,
        seed=0,
        start=4,
        end=total,
        index=2,
        num_stages=3,
        options=TrainOptions(learning_rate=0.1, momentum=0.9),
    )
    order = Repartition(
        run_id="r",
        plan_id=1,
        points=[0, 2, 6, total],
        worker_list=["c", "a", "b"],
        previous_points=[0, 2, 4, total],
        previous_workers=["c", "a", "b"],
        version=0,
    )
    mine = make_stage(
        spec,
        seed=0,
        start=2,
        end=4,
        index=1,
        num_stages=3,
        options=TrainOptions(learning_rate=0.1, momentum=0.9),
    )
    switch = Switch.start("a", order, WeightStore("a"), mine, spec, 0)
    assert switch is not None and switch.pending == {("b", "b"): {4, 5}}
    (request,) = switch.requests()
    assert switch.accept(serve_fetch(WeightStore("b"), owner_stage, request, spec, 0, "r"))
    assert switch.complete
    options = TrainOptions(learning_rate=0.1, momentum=0.9)
    built = switch.build(spec, 0, options)
    assert (built.module.start, built.module.end) == (2, 6)
    torch.testing.assert_close(built.state()["layers.4.0.weight"], owner_stage.state()["layers.4.0.weight"])
