"""A fifth training mode takes one registry line and a package of its own (issue 51): registered at run time
with one :class:`~edgeagent.mode_names.ModeEntry` (``tests/fifth_mode/``, no file of edgeagent edited), the
configuration accepts it, ``--mode`` offers it, :func:`edgeagent.modes.mode` returns it, the wire codec
carries its message, a worker routes an ``Assign`` naming it to its worker session, and the central node
drives its run (attach, execute, save the model). In-memory broker, no process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from edgeagent import mode_names
from edgeagent.cli.main import main
from edgeagent.config import CentralConfig, WorkerConfig, build
from edgeagent.errors import ConfigError, ProtocolError
from edgeagent.mode_names import ModeEntry
from edgeagent.modes import mode
from edgeagent.protocol.messages import Message
from edgeagent.protocol.topics import Family, Topics
from edgeagent.protocol.wire import MESSAGE_TYPES, decode, encode
from edgeagent.roles.central import Central
from edgeagent.roles.worker import Worker
from edgeagent.transport.memory import MemoryBroker, MemoryTransport
from tests.helpers import make_assign

TOPICS = Topics("fifth")


@pytest.fixture
def fifth(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The fifth mode, registered for one test: its one registry line."""
    entry = ModeEntry(
        "fifth", "tests.fifth_mode:FifthMode", "a test's trivial mode", "tests.fifth_mode.messages"
    )
    monkeypatch.setitem(mode_names.MODES, entry.name, entry)
    yield entry.name


def test_a_mode_not_registered_is_refused_everywhere() -> None:
    assert "fifth" not in mode_names.mode_names()
    with pytest.raises(ConfigError, match=r"mode: Input should be 'pipeline', .* or 'allreduce'"):
        build(CentralConfig, {"mode": "fifth"})
    with pytest.raises(ConfigError, match="unknown training mode 'fifth'"):
        mode("fifth")
    result = CliRunner().invoke(main, ["central", "--mode", "fifth", "--print-config"])
    assert result.exit_code == 2 and "'fifth' is not one of" in result.output
    assert all(kind.value != "fifth_hello" for kind in MESSAGE_TYPES)


def test_configuration_and_command_line_take_the_fifth_mode(fifth: str) -> None:
    assert build(CentralConfig, {"mode": fifth}).mode == fifth
    assert fifth in mode_names.modes_help() and mode_names.mode_names()[-1] == fifth
    result = CliRunner().invoke(main, ["central", "--mode", fifth, "--print-config"], prog_name="edgeagent")
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.stdout)["mode"] == fifth
    # A key only other modes read is still refused under it.
    with pytest.raises(ConfigError, match="collective applies to --mode allreduce only"):
        build(CentralConfig, {"mode": fifth, "collective": "ring"})


def test_the_registry_returns_the_fifth_mode(fifth: str) -> None:
    from tests.fifth_mode import FifthMode

    found = mode(fifth)
    assert isinstance(found, FifthMode) and found.name == fifth
    assert mode(fifth) is found


def test_the_fifth_modes_message_round_trips_through_the_wire(fifth: str) -> None:
    from tests.fifth_mode.messages import FifthKind, Hello

    assert MESSAGE_TYPES[FifthKind.HELLO] is Hello
    sent = Hello(run_id="run", text="hi", count=5)
    payload = encode(sent, sender="central")
    assert payload.startswith(b'{"v":1,"k":"fifth_hello"')
    assert decode(payload) == ("central", sent)


def test_a_worker_routes_an_assign_of_the_fifth_mode_to_its_session(fifth: str) -> None:
    from tests.fifth_mode import FifthSession
    from tests.fifth_mode.messages import Hello

    broker = MemoryBroker()
    worker = Worker(
        WorkerConfig(cluster="fifth", device_id="w1"), transport=MemoryTransport(broker, "w1"), modes=mode
    )
    control = TOPICS.device(Family.CONTROL, "w1")
    worker.listen(control)
    central = MemoryTransport(broker, "central")

    def send(msg: Message) -> None:
        central.publish(control, encode(msg, sender="central"))
        worker._step()

    send(make_assign(points=[0, 2, 3], mode=fifth))
    session = worker.session
    assert isinstance(session, FifthSession) and session.run_id == "run"
    send(Hello(run_id="run", text="hi"))  # the session's handler, installed by the node
    assert [h.text for h in session.hellos] == ["hi"]


def test_the_central_node_drives_the_fifth_modes_run(fifth: str, tmp_path: Path) -> None:
    """No worker: the node discovers none, hands the mode its devices, attaches, executes and saves the run,
    and the report is the run's."""
    from tests.fifth_mode import FifthRun

    broker = MemoryBroker()
    config = CentralConfig(
        cluster="fifth", mode=fifth, workers=0, progress=False, save_model=str(tmp_path / "model.pt")
    )
    central = Central(config, transport=MemoryTransport(broker, "central"), modes=mode)
    report = central.run()
    run = central.active
    assert isinstance(run, FifthRun) and run.worker_list == [central.device_id]
    assert report.run_id == central.run_id and report.workers == []
    assert run.saved == [str(tmp_path / "model.pt")]


def test_the_fifth_mode_is_gone_with_its_registry_line(fifth: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert mode(fifth).name == fifth
    monkeypatch.delitem(mode_names.MODES, fifth)
    with pytest.raises(ConfigError, match="unknown training mode 'fifth'"):
        mode(fifth)
    assert all(kind.value != "fifth_hello" for kind in MESSAGE_TYPES)
    with pytest.raises(ProtocolError, match="unknown message kind 'fifth_hello'"):
        decode(b'{"v":1,"k":"fifth_hello","s":"central","b":{"run_id":"run","text":"hi"}}')
