"""Split-federated training's pure parts: topic rights, messages on the wire, FedAvg and the plan's flags."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from edgeagent.config import CentralConfig, TrainConfig
from edgeagent.errors import PlanningError, ProtocolError
from edgeagent.models import ModelSpec, build_model, num_layers
from edgeagent.modes.splitfed.choose import choose, exhaustive_grid, needs_profiles, trial_epoch_seconds
from edgeagent.modes.splitfed.messages import (
    SplitActivation,
    SplitGradient,
    SplitProfile,
    SplitRound,
    SplitUpdate,
)
from edgeagent.protocol.acl import Grant, PlanTracker, may_publish, may_receive, may_subscribe, mosquitto_acl
from edgeagent.protocol.limits import sender_problem
from edgeagent.protocol.topics import Family, Topics
from edgeagent.protocol.wire import decode, encode
from edgeagent.splitfed.fedavg import fedavg, layer_range, shift, state_checksum

T = Topics("site")
DEVICE = Grant("device", "site")
CENTRAL = Grant("central", "site")


def test_a_device_publishes_only_its_own_activations_and_reads_only_its_own_gradients() -> None:
    plans = PlanTracker()
    own_act, other_act = T.device(Family.SPLIT_ACTIVATIONS, "w1"), T.device(Family.SPLIT_ACTIVATIONS, "w2")
    own_grad, other_grad = T.device(Family.SPLIT_GRADIENTS, "w1"), T.device(Family.SPLIT_GRADIENTS, "w2")
    assert may_publish("w1", DEVICE, own_act, plans)
    assert not may_publish("w1", DEVICE, other_act, plans)
    assert not may_publish("w1", DEVICE, own_grad, plans)  # only the server publishes gradients
    assert not may_publish("w1", DEVICE, other_grad, plans)
    assert may_publish("central", CENTRAL, own_grad, plans)
    assert may_receive("w1", DEVICE, own_grad)
    assert not may_receive("w1", DEVICE, other_grad)
    assert not may_receive("w1", DEVICE, other_act)  # another device's activations are not its business
    assert may_receive("central", CENTRAL, other_act)
    assert may_subscribe("w1", DEVICE, own_grad)
    assert not may_subscribe("w1", DEVICE, T.devices(Family.SPLIT_GRADIENTS))
    assert not may_subscribe("w1", DEVICE, T.devices(Family.SPLIT_ACTIVATIONS))
    # The envelope of an activation must name the device whose topic it is on.
    info = T.parse(own_act)
    assert sender_problem(info, "w1") is None and sender_problem(info, "w2") is not None
    acl = mosquitto_acl({"w1": DEVICE})
    assert f"topic write {T.device(Family.SPLIT_ACTIVATIONS, 'w1')}" in acl
    assert f"topic read {T.device(Family.SPLIT_GRADIENTS, 'w1')}" in acl
    assert "split-grad" not in acl.replace(f"topic read {T.device(Family.SPLIT_GRADIENTS, 'w1')}", "")


def test_split_messages_round_trip_and_bad_ones_are_refused() -> None:
    x, y = torch.randn(4, 8), torch.tensor([0, 1, 2, 3])
    for msg in (
        SplitRound(run_id="r", epoch=0, split=1, parallel=2, batch_size=8, tensors={"0.w": x}, checksum="c"),
        SplitActivation(run_id="r", epoch=0, iteration=3, micro=1, x=x, y=y),
        SplitGradient(run_id="r", epoch=0, iteration=3, micro=1, g=x, loss=0.5, correct=2),
        SplitUpdate(run_id="r", epoch=0, device_id="w1", samples=10, iterations=1, tensors={"0.w": x}),
        SplitProfile(run_id="r", device_id="w1", fwd=[0.1, 0.2], bwd=[0.2, 0.3], samples=10),
    ):
        sender, back = decode(encode(msg, sender="w1"))
        assert sender == "w1" and type(back) is type(msg)
        assert encode(back, sender="w1") == encode(msg, sender="w1")
    with pytest.raises(ProtocolError, match="split 0"):
        SplitRound(run_id="r", epoch=0, split=0, parallel=1, batch_size=8, tensors={})
    with pytest.raises(ProtocolError, match="batch size 2"):
        SplitRound(run_id="r", epoch=0, split=1, parallel=4, batch_size=2, tensors={})
    with pytest.raises(ProtocolError, match="iterations -1"):
        SplitRound(run_id="r", epoch=-1, split=1, parallel=1, batch_size=2, tensors={}, iterations=-1)
    with pytest.raises(ProtocolError, match="1 forward and 2 backward"):
        SplitProfile(run_id="r", device_id="w1", fwd=[0.1], bwd=[0.1, 0.2], samples=1)


def test_fedavg_weights_by_samples_and_the_split_halves_make_the_whole_model() -> None:
    spec = ModelSpec("mlp", (1, 8, 8), 10)
    a = build_model(spec, seed=0).state_dict()
    b = build_model(spec, seed=1).state_dict()
    avg = fedavg([a, b], [3.0, 1.0])
    for key in a:
        assert torch.allclose(avg[key], 0.75 * a[key] + 0.25 * b[key], atol=1e-6)
    layers, split = num_layers(spec), 2
    device, server = layer_range(a, 0, split), shift(layer_range(a, split, layers), -split)
    assert min(int(k.split(".")[0]) for k in server) == 0
    assert {**device, **shift(server, split)}.keys() == a.keys()
    assert state_checksum(device) == state_checksum(dict(device)) != state_checksum(layer_range(b, 0, split))
    with pytest.raises(ValueError, match="keys"):
        fedavg([a, device], [1.0, 1.0])
    with pytest.raises(ValueError, match="positive"):
        fedavg([a], [0.0])


def test_the_plan_flags() -> None:
    spec = ModelSpec("mlp", (1, 8, 8), 10)
    layers = num_layers(spec)

    def config(**kw: object) -> CentralConfig:
        return CentralConfig(mode="split-federated", train=TrainConfig(batch_size=16), **kw)

    fl, _ = choose(config(splitfed_plan="fl"), spec, layers, ["w1", "w2"], None, None)
    assert fl == {"w1": (layers, 1), "w2": (layers, 1)}
    fixed, _ = choose(
        config(splitfed_plan="fixed", split_point=2, parallel_batches=4), spec, layers, ["w1"], None, None
    )
    assert fixed == {"w1": (2, 4)}
    assert not needs_profiles(config(splitfed_plan="fl"))
    assert not needs_profiles(config(splitfed_plan="ours", split_point=2, parallel_batches=2))
    assert needs_profiles(config(splitfed_plan="ours")) and needs_profiles(config(splitfed_plan="sfl"))
    with pytest.raises(PlanningError, match="has 6 layers"):
        choose(config(splitfed_plan="fixed", split_point=7), spec, layers, ["w1"], None, None)
    with pytest.raises(PlanningError, match="exceeds the batch size 16"):
        choose(config(splitfed_plan="fixed", parallel_batches=17), spec, layers, ["w1"], None, None)


def test_the_fig6_plot_is_written_for_split_federated_reports_only(tmp_path: Path) -> None:
    from edgeagent.modes.splitfed.plot import plot_splitfed

    json_path = tmp_path / "report.json"
    assert plot_splitfed({"mode": "pipeline", "splitfed": {}}, json_path) is None
    assert plot_splitfed({"mode": "allreduce"}, json_path) is None
    written = plot_splitfed({"mode": "split-federated", "splitfed": {"epochs": []}}, json_path)
    assert written is not None and written.exists() and written.stat().st_size > 0


def test_the_exhaustive_search_grid_and_its_epoch_estimate() -> None:
    """Every common (P, N) with P < L and N up to the bound, FL's (L, 1), the first pair twice (warm-up);
    a trial's epoch: the exchange once plus training per iteration x the shard's iterations, slowest
    device."""
    assert exhaustive_grid(3, 4, 2) == [(1, 1), (1, 1), (1, 2), (2, 1), (2, 2), (3, 1)]
    assert len(exhaustive_grid(5, 100, None)) == 1 + 4 * 100 + 1
    assert exhaustive_grid(5, 3, 8)[-2:] == [(4, 3), (5, 1)]

    def update(samples: int, iterations: int, train: float) -> SplitUpdate:
        return SplitUpdate(
            run_id="r",
            epoch=-1,
            device_id="w",
            samples=samples,
            iterations=iterations,
            tensors={},
            train_seconds=train,
        )

    # w1: 1.5 s round trip, 1 s of it training 1 iteration; 320 samples at B = 32: 10 iterations.
    # w2: 0.5 s exchange + 2 x 0.25 s per iteration of 2, 64 samples: 2 iterations.
    est = trial_epoch_seconds({"w1": (1.5, update(320, 1, 1.0)), "w2": (1.0, update(64, 2, 0.5))}, 32)
    assert est == pytest.approx(0.5 + 10 * 1.0)
    assert trial_epoch_seconds({"w2": (1.0, update(64, 2, 0.5))}, 32) == pytest.approx(1.0)
    assert trial_epoch_seconds({}, 32) == float("inf")
    assert needs_profiles(CentralConfig(mode="split-federated", splitfed_plan="exhaustive"))
