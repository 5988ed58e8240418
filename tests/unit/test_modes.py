"""The training-mode registry, and a worker's run as its mode's session: installed by an ``Assign`` that
names the mode, gone with the run. In-memory broker."""

from __future__ import annotations

import pytest

from edgeagent.config import WorkerConfig
from edgeagent.errors import ConfigError
from edgeagent.models import ModelSpec
from edgeagent.modes import MODES, mode
from edgeagent.modes.pipeline import PipelineMode
from edgeagent.modes.pipeline.worker.session import PipelineSession
from edgeagent.protocol.commands import Emulate, Ping, Stop
from edgeagent.protocol.messages import ErrorReport, Message, Ready
from edgeagent.protocol.topics import Family, Topics
from edgeagent.protocol.wire import decode, encode
from edgeagent.roles.worker import Worker
from edgeagent.transport.memory import MemoryBroker, MemoryTransport
from tests.helpers import make_assign

TOPICS = Topics("modes")
SPEC = ModelSpec("mlp", (64,), 10, (("hidden", (128, 64)),))


def test_registry_names_the_pipeline_and_rejects_unknown_modes() -> None:
    assert {"allreduce", "hybrid", "pipeline"} <= set(MODES)
    assert mode("hybrid").name == "hybrid"
    found = mode("pipeline")
    assert isinstance(found, PipelineMode) and found.name == "pipeline"
    assert mode("pipeline") is found  # one instance per process
    with pytest.raises(ConfigError, match=r"unknown training mode 'ring'.*pipeline"):
        mode("ring")


class Device:
    """Worker ``w1`` on an in-memory broker, with everything it sends recorded."""

    def __init__(self) -> None:
        broker = MemoryBroker()
        self.worker = Worker(
            WorkerConfig(cluster="modes", device_id="w1"), transport=MemoryTransport(broker, "w1"), modes=mode
        )
        self.worker.listen(TOPICS.device(Family.CONTROL, "w1"))
        self.worker.listen(TOPICS.fixed(Family.COMMAND))
        self.pub = MemoryTransport(broker, "central")
        self.sent: list[Message] = []
        MemoryTransport(broker, "spy").subscribe(
            TOPICS.device(Family.REPLY, "w1"), lambda _t, p: self.sent.append(decode(p)[1])
        )

    def send(self, topic: str, msg: Message) -> None:
        self.pub.publish(topic, encode(msg, sender="central"))
        self.worker._step()

    def assign(self, training: str = "pipeline") -> None:
        assign = make_assign(points=[0, 2, 3], model=SPEC.to_dict(), batches_per_epoch=10, mode=training)
        self.send(TOPICS.device(Family.CONTROL, "w1"), assign)

    def replies(self, kind: type[Message]) -> list[Message]:
        return [m for m in self.sent if isinstance(m, kind)]


def test_a_device_left_out_of_a_run_still_takes_that_runs_emulate_command() -> None:
    """Left out of the plan, a device is idle but may be asked back: a slowdown change for it (`--change-
    slowdown`) must reach it, or the run would measure it later as it was. Another run's does not."""
    device = Device()
    device.assign()
    device.worker.end_run(rejoin=True)  # the run goes on without it
    assert device.worker.session is None and device.worker.left_run == "run"
    command = TOPICS.fixed(Family.COMMAND)
    device.send(command, Emulate(run_id="other", device="w1", slowdown=5.0))
    assert device.worker.slowdown == 1.0
    device.send(command, Emulate(run_id="run", device="w1", slowdown=5.0))
    assert device.worker.slowdown == 5.0


def test_worker_reports_an_assign_of_an_unknown_mode_and_stays_idle() -> None:
    device = Device()
    device.assign("ring")
    assert device.worker.session is None
    [report] = device.replies(ErrorReport)
    assert isinstance(report, ErrorReport) and report.code == "assign" and report.run_id == "run"
    assert "unknown training mode 'ring'" in report.reason


def test_the_sessions_handlers_last_as_long_as_its_run() -> None:
    device = Device()
    device.assign()
    session = device.worker.session
    assert isinstance(session, PipelineSession) and session.run.index == 1
    assert [r.phase for r in device.replies(Ready) if isinstance(r, Ready)] == ["built"]
    command = TOPICS.fixed(Family.COMMAND)
    device.send(command, Ping(run_id="run"))
    device.send(command, Emulate(run_id="run", device="w1", slowdown=2.0))  # the node's own command
    assert [r.phase for r in device.replies(Ready) if isinstance(r, Ready)] == ["built", "alive"]
    assert device.worker.slowdown == 2.0
    device.send(command, Stop(run_id="run"))
    assert device.worker.session is None and device.worker.completed_runs == 1
    device.send(command, Ping(run_id="run"))  # no run: nobody answers
    device.send(command, Emulate(run_id="run", device="w1", slowdown=3.0))  # commands belong to a run
    assert len(device.replies(Ready)) == 2 and device.worker.slowdown == 2.0
    device.assign()  # the node takes the next run
    assert device.worker.session is not None and device.worker.session is not session
