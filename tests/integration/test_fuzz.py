"""Fuzzing live roles: hypothesis publishes random and mutated payloads to every topic while a run trains.

A real run (the central node in a thread of this process, two worker processes, an embedded broker)
trains while a separate client publishes one drawn payload to one drawn topic per example: random
bytes, random JSON and CBOR (with the tensor and chunk tags), envelopes of every kind with random
bodies, real messages of every kind (of another run) with flipped, inserted and deleted bytes, and
activations and gradients of *the run itself* whose tensors do not fit or whose batch ids are not in
flight. The roles must log and drop all of it, and the run must finish as if nothing had happened.

Never sent: a valid message that would legitimately change the run (a ``stop`` for this run, a
heartbeat or an ``offline`` status in a worker's name, a batch of the right shape for a batch in
flight): keeping those out is the broker ACL's job, not the roles'.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import subprocess
import threading
import time
import typing
from pathlib import Path
from typing import Any

import cbor2
import pytest
import torch
from cbor2 import CBORTag
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from edgeagent.cli.demo import worker_command
from edgeagent.config import CentralConfig, TrainConfig
from edgeagent.data import load_dataset
from edgeagent.errors import ProtocolError
from edgeagent.models import ModelSpec, layer_output_shapes
from edgeagent.modes import mode
from edgeagent.modes.allreduce.messages import AllreduceDone, AllreduceMsg, AllreduceStep
from edgeagent.modes.pipeline.central.run import PipelineRun
from edgeagent.modes.splitfed.messages import (
    SplitActivation,
    SplitGradient,
    SplitProfile,
    SplitRound,
    SplitUpdate,
)
from edgeagent.protocol.chunking import CHUNK_TAG
from edgeagent.protocol.commands import Ping
from edgeagent.protocol.limits import InboxLimits
from edgeagent.protocol.messages import (
    Activation,
    ActivationMode,
    Announce,
    Commit,
    Discover,
    ErrorReport,
    EvalResult,
    Event,
    FetchRequest,
    Gradient,
    GradSync,
    Heartbeat,
    LinkReport,
    Message,
    MessageKind,
    Metrics,
    Probe,
    Profile,
    Ready,
    Repartition,
    Status,
    Weights,
)
from edgeagent.protocol.tensors import BOOL_TAG, MULTI_DIM_TAG
from edgeagent.protocol.topics import Family, Topics, topic_matches
from edgeagent.protocol.wire import MESSAGE_TYPES, encode
from edgeagent.roles.central import Central, RunReport
from edgeagent.transport.mqtt import MqttTransport
from tests.helpers import make_assign

pytestmark = pytest.mark.slow

WORKERS = ["worker-1", "worker-2"]
DEVICES = ["central", *WORKERS]
FUZZER = "fuzzer"  # the sender of everything fuzzed, and the unknown device id of the topics
FOREIGN = "fuzz-run-0000"  # the run id of the real messages that get mutated
EXAMPLES = 2000
FLOOD = 1000  # the flood example publishes this many copies at once (far over a control-plane burst,
# even when a busy broker spreads their delivery over seconds)


# ---------------------------------------------------------------------------------------------
# Topics: the whole tree for the devices of the run, an unknown device, and every stage


def fuzz_topics(topics: Topics, num_stages: int) -> list[str]:
    """Every topic a role of this run can subscribe to, and a few outside the protocol."""
    out = []
    for family in Family:  # each family is fixed, per device or per stage: Topics refuses the others
        with contextlib.suppress(ValueError):
            out.append(topics.fixed(family))
        with contextlib.suppress(ValueError):
            out += [topics.device(family, d) for d in [*DEVICES, FUZZER]]
        with contextlib.suppress(ValueError):
            out += [topics.stage(family, s, d) for s in range(num_stages + 1) for d in [*DEVICES, FUZZER]]
    # Data-parallel training's links (allreduce mode): sender -> receiver, the fuzzer as either end.
    ends = [*DEVICES, FUZZER]
    out += [topics.link(a, b) for a in ends for b in ends if a != b]
    # Outside the protocol, but inside the roles' wildcards (device/+/...): an invalid device id.
    out += [f"{topics.base}/device/{'x' * 65}/heartbeat", f"{topics.base}/device/bad!id/request"]
    out.append(f"{topics.base}/device/{FUZZER}/no-such-family")
    return sorted(out)


# ---------------------------------------------------------------------------------------------
# Payload strategies

TAGS = [MULTI_DIM_TAG, BOOL_TAG, CHUNK_TAG, 64, 72, 77, 78, 79, 84, 85, 86, 0, 1, 2, 3, 55799]

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=24)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)


def tags(children: st.SearchStrategy[Any]) -> st.SearchStrategy[CBORTag]:
    return st.builds(CBORTag, st.sampled_from(TAGS), children)


cbor_scalars = json_scalars | st.binary(max_size=64)
cbor_values = st.recursive(
    cbor_scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=12) | st.integers(-5, 5), children, max_size=4)
        | tags(children)
    ),
    max_leaves=12,
)

# A tensor as the wire carries it (Tag 40 around a typed array), with any shape and any tag.
wire_tensors = st.builds(
    lambda shape, tag, data: CBORTag(MULTI_DIM_TAG, [shape, CBORTag(tag, data)]),
    st.lists(st.integers(-2, 2**40) | st.just(3), max_size=4),
    st.sampled_from([64, 72, 77, 78, 79, 84, 85, 86, 99]),
    st.binary(max_size=64),
)
chunk_frames = st.builds(
    lambda fields: CBORTag(CHUNK_TAG, fields),
    st.tuples(
        st.text(max_size=8),
        st.integers(-2, 5),
        st.integers(-2, 5),
        st.integers(-2, 2**40),
        st.binary(max_size=40),
        st.binary(max_size=64),
    ).map(list)
    | st.lists(cbor_scalars, max_size=8),
)


def safe_cbor(value: Any) -> bytes:
    try:
        return cbor2.dumps(value)
    except Exception:  # a value cbor2 cannot write (e.g. a semantic tag it checks): send its repr
        return repr(value).encode()


random_bytes = st.binary(max_size=2048)
random_json = json_values.map(lambda v: json.dumps(v).encode())
random_cbor = (cbor_values | wire_tensors | chunk_frames).map(safe_cbor)
# Over the 64 KiB control-plane limit; just junk on the data plane.
oversized = st.integers(64 * 1024 + 1, 96 * 1024).map(lambda n: b"{" + b" " * n)

# Envelopes of a random kind whose body mixes the kind's field names with random keys and values.
FIELDS = {kind.value: sorted(f.name for f in dataclasses.fields(cls)) for kind, cls in MESSAGE_TYPES.items()}


@st.composite
def random_envelopes(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(sorted(FIELDS)) | st.text(max_size=10))
    keys = FIELDS.get(kind, [])
    values = cbor_values | wire_tensors
    body = draw(
        st.dictionaries(
            st.sampled_from(keys) if keys else st.text(max_size=8), values, max_size=max(1, len(keys))
        )
    )
    if kind == MessageKind.ANNOUNCE.value:
        body["busy_with"] = FOREIGN  # an idle announcement is a device offering to join: legitimate
    sender = draw(st.just(FUZZER) | st.text(max_size=12).filter(lambda s: s not in DEVICES))
    envelope = {"v": draw(st.just(1) | st.integers(-1, 3)), "k": kind, "s": sender, "b": body}
    if draw(st.booleans()):
        return json.dumps(envelope, default=repr).encode()
    return safe_cbor(envelope)


def base_messages(spec: ModelSpec) -> list[Message]:
    """One message of every kind, of another run, sent by the fuzzer."""
    x, y = torch.randn(2, 64), torch.tensor([1, 2])
    messages: list[Message] = [
        Discover(run_id=FOREIGN),
        Announce(device_id=FUZZER, busy_with=FOREIGN),
        Status(device_id=FUZZER, state="idle", run_id=FOREIGN),
        Heartbeat(device_id=FUZZER, seq=1, run_id=FOREIGN),
        make_assign(run_id=FOREIGN, worker_list=["central", FUZZER], points=[0, 1, 3], model=spec.to_dict()),
        Ready(run_id=FOREIGN, plan_id=0, device_id=FUZZER, stage=1, parameters=10),
        Activation(run_id=FOREIGN, plan_id=0, stage=0, batch_id=0, version=0, mode="train", x=x, y=y),
        Gradient(run_id=FOREIGN, plan_id=0, stage=1, batch_id=0, g=x, loss=1.0, stage_times=[0.1]),
        EvalResult(run_id=FOREIGN, plan_id=0, batch_id=0, correct=1, count=2, loss_sum=1.5),
        Ping(run_id=FOREIGN),
        Weights(
            run_id=FOREIGN,
            device_id=FUZZER,
            stage=1,
            start=1,
            end=2,
            version=0,
            tensors={"layers.1.0.weight": torch.zeros(2, 2)},
            purpose="chain",
        ),
        Commit(run_id=FOREIGN, plan_id=1),
        Metrics(device_id=FUZZER, values={"batches": 1}, run_id=FOREIGN),
        Event(name="fuzz", run_id=FOREIGN, details={"batch": 1}),
        ErrorReport(device_id=FUZZER, code="message", reason="fuzzed", run_id=FOREIGN),
        Probe(source=FUZZER, target=WORKERS[0], nonce=7, padding=b"\0" * 16),
        Profile(device_id=FUZZER, settings={"id": FUZZER}, digest="0"),
        LinkReport(run_id=FOREIGN, source=FUZZER, target=WORKERS[0], bandwidth=1e6, latency=1e-3),
        Repartition(
            run_id=FOREIGN,
            plan_id=1,
            points=[0, 1, 3],
            worker_list=["central", FUZZER],
            previous_points=[0, 2, 3],
            previous_workers=["central", FUZZER],
            version=0,
        ),
        FetchRequest(run_id=FOREIGN, plan_id=1, requester=FUZZER, owner=WORKERS[0], layers=[1]),
        GradSync(
            run_id=FOREIGN,
            plan_id=0,
            stage=1,
            batch_id=0,
            share_version=0,
            device_id=FUZZER,
            rows=[0, 2],
            total=4,
            grads={"layers.1.0.weight": torch.zeros(2, 2)},
        ),
        # Data-parallel training (allreduce mode).
        AllreduceStep(run_id=FOREIGN, step=0, attempt=0, members=[FUZZER, WORKERS[0]]),
        AllreduceMsg(run_id=FOREIGN, step=0, attempt=0, kind="data_reduce", sender=0, data=torch.zeros(4)),
        AllreduceDone(
            run_id=FOREIGN,
            device_id=FUZZER,
            step=0,
            attempt=0,
            digest="0",
            loss=0.0,
            samples=1,
            contributors=[0],
        ),
        # Split-federated training (PiPar).
        SplitRound(
            run_id=FOREIGN, epoch=0, split=1, parallel=1, batch_size=2, tensors={"0.weight": torch.zeros(2)}
        ),
        SplitActivation(
            run_id=FOREIGN,
            epoch=0,
            iteration=0,
            micro=0,
            x=torch.zeros(2, 3),
            y=torch.zeros(2, dtype=torch.long),
        ),
        SplitGradient(run_id=FOREIGN, epoch=0, iteration=0, micro=0, g=torch.zeros(2, 3), loss=0.0),
        SplitUpdate(
            run_id=FOREIGN,
            epoch=0,
            device_id=FUZZER,
            samples=2,
            iterations=1,
            tensors={"0.weight": torch.zeros(2)},
        ),
        SplitProfile(run_id=FOREIGN, device_id=FUZZER, fwd=[0.1], bwd=[0.2], samples=2),
    ]
    assert {m.KIND for m in messages} == set(MESSAGE_TYPES), "one message of every kind"
    return messages


@st.composite
def mutated(draw: st.DrawFn, payloads: list[bytes]) -> bytes:
    """A real payload with a few bytes flipped, inserted or deleted, or cut short (or untouched)."""
    data = bytearray(draw(st.sampled_from(payloads)))
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        i = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "insert":
            data.insert(i, draw(st.integers(0, 255)))
        elif op == "delete" and data:
            del data[i]
        elif op == "truncate":
            del data[i:]
    return bytes(data)


DTYPES = [torch.float32, torch.float64, torch.float16, torch.int64, torch.int32, torch.uint8, torch.bool]


def run_batches(run_id: str, plan_id: int, legit: set[tuple[int, ...]], num_classes: int) -> Any:
    """Activations, gradients and results of the run itself that must not be taken.

    Their tensors do not fit any stage (a shape no stage boundary has, or a dtype no stage uses); or,
    if they do fit, their batch ids cannot be in flight (negative, or far beyond the run's batches).
    """

    def fits(t: torch.Tensor) -> bool:
        return t.dtype == torch.float32 and t.dim() >= 1 and tuple(t.shape[1:]) in legit

    misfits = st.builds(
        lambda shape, dtype: torch.zeros(shape, dtype=dtype),
        st.lists(st.integers(0, 6), max_size=4),
        st.sampled_from(DTYPES),
    ).filter(lambda t: not fits(t))
    fitting = st.builds(
        lambda b, sample: torch.randn((b, *sample)),
        st.integers(1, 4),
        st.sampled_from(sorted(legit)),
    )
    unknown_ids = st.integers(-(2**40), -1) | st.integers(10**6, 2**40)
    any_ids = st.integers(-3, 400) | unknown_ids
    tensor_and_id = st.tuples(misfits, any_ids) | st.tuples(fitting, unknown_ids)

    def labels(x: torch.Tensor) -> st.SearchStrategy[torch.Tensor]:
        b = x.shape[0] if x.dim() else 1
        good = st.lists(st.integers(0, num_classes - 1), min_size=b, max_size=b).map(torch.tensor)
        return good | st.lists(st.integers(-3, num_classes + 3), max_size=5).map(
            lambda v: torch.tensor(v, dtype=torch.int64)
        )

    # Compressed tensors as a sloppy peer might send them: maps with the right keys and any values.
    compressed = st.dictionaries(
        st.sampled_from(["v", "codec", "shape", "dtype", "params", "data"]), cbor_scalars
    )

    def tensor_field(draw: st.DrawFn, t: torch.Tensor) -> Any:
        """Mostly the tensor; one time in ten a compressed tensor's map in its place."""
        return draw(compressed) if draw(st.integers(0, 9)) == 0 else t

    # Also modes no stage knows (the decoder drops them).
    modes: st.SearchStrategy[str] = st.sampled_from(typing.get_args(ActivationMode)) | st.text(max_size=6)

    @st.composite
    def activation(draw: st.DrawFn) -> tuple[str, Message]:
        x, batch = draw(tensor_and_id)
        stage = draw(st.integers(0, 2))
        msg = Activation(
            run_id=run_id,
            plan_id=plan_id,
            stage=draw(st.just(stage) | st.integers(-1, 4)),
            batch_id=batch,
            version=draw(st.integers(-1, 3) | st.integers(0, 2**40)),
            mode=typing.cast(ActivationMode, draw(modes)),
            x=tensor_field(draw, x),
            y=draw(labels(x)),
        )
        return f"act/{stage}", msg

    @st.composite
    def gradient(draw: st.DrawFn) -> tuple[str, Message]:
        g, batch = draw(tensor_and_id)
        stage = draw(st.integers(1, 3))
        msg = Gradient(
            run_id=run_id,
            plan_id=plan_id,
            stage=draw(st.just(stage) | st.integers(-1, 4)),
            batch_id=batch,
            g=tensor_field(draw, g),
            loss=draw(st.floats(allow_nan=False, allow_infinity=False)),
            correct=draw(st.integers(-5, 100)),
            stage_times=draw(st.lists(st.floats(0, 1), max_size=3)),
        )
        return f"grad/{stage}", msg

    @st.composite
    def result(draw: st.DrawFn) -> tuple[str, Message]:
        msg = EvalResult(
            run_id=run_id,
            plan_id=plan_id,
            batch_id=draw(unknown_ids),
            correct=draw(st.integers(0, 10**6)),
            count=draw(st.integers(0, 10**6)),
            loss_sum=draw(st.floats(0, 1e6)),
        )
        return f"result/{draw(st.integers(0, 3))}", msg

    return activation() | gradient() | result()


# ---------------------------------------------------------------------------------------------
# The test


class Pacer:
    """The central node's progress hook: it tells when training started and, while the fuzzer is at it,
    slows the run down so that the fuzzing happens during training, never after it."""

    def __init__(self) -> None:
        self.training = threading.Event()
        self.fuzzed = threading.Event()
        self.batch = 0
        self.total = 0

    def __call__(self, values: dict[str, Any]) -> None:
        if "batch" not in values:
            return
        self.batch, self.total = values["batch"], values["total"]
        self.training.set()
        if self.fuzzed.is_set():
            return
        if self.total - self.batch <= 5:  # nearly done: wait for the fuzzer, with the run still live
            self.fuzzed.wait(60)
        else:
            time.sleep(0.03)


def test_fuzzed_payloads_on_every_topic_are_dropped_while_the_run_trains(
    amqtt_url: str, cluster: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    topics = Topics(cluster)
    train = TrainConfig(epochs=3, batch_size=32)
    config = CentralConfig(
        broker=amqtt_url,
        cluster=cluster,
        workers=len(WORKERS),
        train=train,
        progress=False,
        partition="uniform",  # "dynamic" would also take a fuzzed idle announcement as a device joining
        batch_timeout=60.0,  # the pacer holds the run at its end until the fuzzer is done
        # The flood goes through the broker the central node shares this process with: the workers'
        # heartbeats queue behind a thousand messages (3.2 s seen), which 3 missed beats of 1 s do not
        # cover. Liveness is not what this test is about: 3 missed beats of 3 s do.
        heartbeat_interval=3.0,
    )
    env = dict(os.environ, EDGEAGENT_LOG_LEVEL="INFO", COLUMNS="400")
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs = {w: tmp_path / f"{w}.log" for w in WORKERS}
    for w in WORKERS:
        with open(logs[w], "wb") as out:
            procs[w] = subprocess.Popen(
                worker_command(w, amqtt_url, cluster, 1.0), stdout=out, stderr=subprocess.STDOUT, env=env
            )

    pacer = Pacer()
    # The control plane's rate limit at a tenth of its default (still 10x any legitimate topic's rate):
    # a loaded broker may spread the flood's delivery over many seconds, and at the default rate a slow
    # enough delivery never exceeds the bucket (a flaky test on a busy machine).
    central = Central(
        config, progress=pacer, limits=InboxLimits(control_rate=10.0, control_burst=20.0), modes=mode
    )
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["report"] = central.run()
        except BaseException as exc:  # reported by the main thread
            outcome["error"] = exc

    runner = threading.Thread(target=run, daemon=True)
    fuzzer = MqttTransport(amqtt_url, f"fuzzer-{cluster}")
    try:
        runner.start()
        assert fuzzer.wait_connected(10)
        assert pacer.training.wait(120), f"training never started: {outcome}"

        # The topics: every topic of the tree for this run's devices, an unknown device and every stage.
        data = load_dataset(train.dataset, seed=train.seed, test_fraction=train.test_fraction)
        spec = ModelSpec(train.model, data.in_shape, data.num_classes)
        active = central.active
        assert isinstance(active, PipelineRun)
        num_stages = len(active.state.worker_list)
        targets = fuzz_topics(topics, num_stages)
        live = central.transport._patterns()
        uncovered = [p for p in live if not any(topic_matches(p, t) for t in targets)]
        assert not uncovered, f"the central node listens to {uncovered}, which no fuzzed topic reaches"
        families = set()
        for t in targets:
            with contextlib.suppress(ProtocolError):  # the topics outside the protocol
                families.add(topics.parse(t).family)
        assert families == set(Family)

        # The payloads.
        legit = {(*spec.in_shape,)} | {s[1:] for s in layer_output_shapes(spec)}
        run_messages = run_batches(central.run_id, active.state.plan_id, legit, data.num_classes)
        real = [encode(m, sender=FUZZER) for m in base_messages(spec)]
        junk = random_bytes | random_json | random_cbor | random_envelopes() | mutated(real) | oversized
        sent = {"messages": 0, "run": 0, "floods": 0}
        run_id, plan_id, w1 = central.run_id, active.state.plan_id, WORKERS[0]
        holders = list(active.state.worker_list)  # partition="uniform": the split never changes
        wrong = torch.zeros(3, 5)

        junk_cases = st.tuples(st.sampled_from(targets), junk)
        run_cases = st.tuples(st.just("run"), run_messages)

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        # Explicit examples: one of each kind of drop, whatever the random ones hit.
        @example(("flood", b"\xff flood"))
        @example((topics.device(Family.HEARTBEAT, w1), b"{" + b" " * (64 * 1024)))
        @example(
            (topics.device(Family.STATUS, w1), encode(Status(device_id=w1, state="offline"), sender=FUZZER))
        )
        @example((f"{topics.base}/device/{'x' * 65}/heartbeat", b"{}"))
        @example(
            (
                "run",
                ("grad/1", Gradient(run_id=run_id, plan_id=plan_id, stage=1, batch_id=0, g=wrong, loss=0)),
            )
        )
        @example(
            (
                "run",
                ("grad/2", Gradient(run_id=run_id, plan_id=plan_id, stage=2, batch_id=0, g=wrong, loss=0)),
            )
        )
        @example(
            (
                "run",
                (
                    "act/0",
                    Activation(
                        run_id=run_id,
                        plan_id=plan_id,
                        stage=0,
                        batch_id=0,
                        version=0,
                        mode="train",
                        x=wrong,
                        y=torch.zeros(3, dtype=torch.int64),
                    ),
                ),
            )
        )
        @given(st.sampled_from([junk_cases, junk_cases, run_cases]).flatmap(lambda cases: cases))
        def fuzz(case: tuple[str, Any]) -> None:
            if "report" in outcome or "error" in outcome:
                return  # the run is over (the assertions below say why)
            where, what = case
            if where == "run":
                # As the stage's device, on its topic (no ACL here to stop that): the stage's own checks,
                # not the sender's, must drop these. A stage the run does not have: as the fuzzer.
                suffix, msg = what
                kind, stage = suffix.split("/")
                holder = holders[int(stage)] if int(stage) < len(holders) else FUZZER
                topic = f"{topics.base}/stage/{stage}/{kind}/{holder}"
                fuzzer.publish(topic, encode(msg, sender=holder), qos=0)
                sent["run"] += 1
            elif where == "flood":  # over the control-plane burst of the fuzzer's own heartbeat topic
                for _ in range(FLOOD):
                    fuzzer.publish(topics.device(Family.HEARTBEAT, FUZZER), what, qos=0)
                sent["floods"] += 1
            else:
                fuzzer.publish(where, what, qos=0)
            sent["messages"] += 1

        started = time.monotonic()
        fuzz()
        print(f"fuzzed for {time.monotonic() - started:.1f} s: {sent}; batch {pacer.batch} of {pacer.total}")
        # Still training, both workers alive, and the run goes on to its end.
        assert "report" not in outcome and "error" not in outcome, outcome
        assert pacer.batch < pacer.total
        for w, proc in procs.items():
            assert proc.poll() is None, f"{w} died under fuzzing: {logs[w].read_text()[-3000:]}"
    finally:
        pacer.fuzzed.set()
        fuzzer.close()
        runner.join(120)
        for proc in procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    assert "error" not in outcome, outcome.get("error")
    report: RunReport = outcome["report"]
    assert report.epochs == 3
    assert report.batches == pacer.total
    assert report.final_accuracy > 0.6, report.test_accuracy_per_epoch  # chance is 0.1
    assert report.recoveries == []  # nothing fuzzed looked like a fault

    # Everyone dropped what was fuzzed at them, said so, and stayed up to the end of the run.
    assert sent["messages"] >= EXAMPLES // 2 and sent["run"] > 20 and sent["floods"] > 0, sent
    drops = central.gate.drops
    for reason in ("malformed", "sender", "oversize", "rate", "topic", "invalid"):
        assert drops[reason] > 0, f"the central node dropped no {reason!r} message: {dict(drops)}"
    assert central.dropped >= sum(drops.values())
    central_lines = [r.getMessage() for r in caplog.records if r.name == "edgeagent.runtime.role"]
    assert 0 < len(central_lines) < 400, "drops are logged, and a flood does not flood the log"
    for w, proc in procs.items():
        text = logs[w].read_text()
        assert proc.returncode == 0, f"{w} exited with {proc.returncode}: {text[-3000:]}"
        assert "Traceback" not in text, f"{w}: {text[-3000:]}"
        assert f"{w}: dropped a" in text, f"{w} logged no drop: {text[-3000:]}"
        assert f"{w}: run {report.run_id} finished after {pacer.total} batches" in text, text[-3000:]
    # The workers' totals: the first worker (stage 1) took none of the batches that did not fit.
    total = re.search(r"worker-1: \d+ messages dropped so far \(([^)]*)\)", logs[WORKERS[0]].read_text())
    assert total is not None and "invalid" in total.group(1), logs[WORKERS[0]].read_text()[-3000:]
