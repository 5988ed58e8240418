"""A user's mistake ends every command with one ``error:`` line and a non-zero exit, never a traceback.

Each case runs the real command line in a subprocess, as a user would; none of them trains.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

TIMEOUT = 120


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgeagent", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=cwd,
    )


def assert_user_error(proc: subprocess.CompletedProcess[str], *expected: str) -> str:
    """Non-zero exit, no traceback, and the error on one stderr line naming what is wrong."""
    assert proc.returncode != 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith(("error:", "Error:"))]
    assert len(errors) == 1, proc.stderr
    for text in expected:
        assert text in errors[0], errors[0]
    return errors[0]


@pytest.fixture
def garbage(tmp_path: Path) -> Path:
    path = tmp_path / "garbage.pt"
    path.write_text("not a torch file\n")
    return path


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


# -- caught before anything starts ---------------------------------------------------------------


def test_an_unwritable_report_path_fails_before_training(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "dir" / "report.json"
    proc = run_cli("demo", "--no-progress", "--report", str(missing))
    assert_user_error(proc, "--report", "does not exist")
    assert "done" not in proc.stderr  # it did not train first


def test_an_unwritable_save_model_path_fails_before_training(tmp_path: Path) -> None:
    proc = run_cli("demo", "--no-progress", "--save-model", str(tmp_path / "missing" / "model.pt"))
    assert_user_error(proc, "--save-model", "does not exist")


def test_init_weights_that_are_not_a_state_dict(garbage: Path) -> None:
    assert_user_error(run_cli("demo", "--no-progress", "--init-weights", str(garbage)), "--init-weights")


def test_resume_from_a_file_that_is_not_a_checkpoint(garbage: Path) -> None:
    assert_user_error(run_cli("central", "--resume", str(garbage)), "--resume", "--checkpoint")


def test_a_worker_config_that_is_not_yaml(tmp_path: Path) -> None:
    bad = tmp_path / "worker.yaml"
    bad.write_text("id: [unclosed\n  broker: : :\n")
    assert_user_error(run_cli("worker", "--config", str(bad), "--once"), str(bad))


def test_a_broker_on_a_port_in_use(busy_port: int) -> None:
    assert_user_error(run_cli("broker", "--port", str(busy_port)), f"127.0.0.1:{busy_port}", "--port")


def test_a_monitor_without_a_broker_exits_non_zero() -> None:
    """It used to print the error and exit 0, so scripts thought it had run."""
    proc = run_cli("monitor", "--broker", "mqtt://127.0.0.1:1", "--duration", "1", "--connect-timeout", "1.5")
    assert_user_error(proc, "cannot reach", "within 1.5 s")


def test_profile_push_from_a_missing_directory(tmp_path: Path) -> None:
    proc = run_cli("profile", "push", "--profiles-dir", str(tmp_path / "devices"))
    assert_user_error(proc, "--profiles-dir", "devices")


def test_credentials_in_a_directory_that_cannot_be_made(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = run_cli("credentials", "add", "--credentials-dir", str(blocker / "creds"), "pi-1")
    assert_user_error(proc, str(blocker / "creds"))


def test_credentials_with_a_wildcard_discovery_prefix(tmp_path: Path) -> None:
    proc = run_cli(
        "credentials",
        "add",
        "--credentials-dir",
        str(tmp_path),
        "--role",
        "central",
        "--home-assistant-prefix",
        "#",
        "c",
    )
    assert_user_error(proc, "discovery prefix '#'")


def test_certs_in_a_directory_that_cannot_be_made(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = run_cli("certs", "--certs-dir", str(blocker / "tls"), "--host", "127.0.0.1", "--device", "pi-1")
    assert_user_error(proc)


# -- caught by the run (the demo starts its own broker; central uses a test broker) -------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--dataset", "no-such-file.npz"), "no-such-file.npz"),
        (("--model", "resnet"), "unknown model 'resnet'"),
        (("--model-option", "hidden=abc"), "hidden"),
        (("--model-option", "widht=3"), "widht"),
        (("--mode", "pipeline", "--workers", "9"), "9 workers"),
    ],
)
def test_demo_with_bad_training_input(args: tuple[str, ...], expected: str, tmp_path: Path) -> None:
    """Refused before the demo starts its broker and workers (it once started them, then refused)."""
    proc = run_cli("demo", "--no-progress", "--epochs", "1", "--log-level", "INFO", *args, cwd=tmp_path)
    assert_user_error(proc, expected)
    assert "broker listening" not in proc.stderr and "waiting for" not in proc.stderr, proc.stderr


def test_central_with_more_workers_than_layers(amqtt_url: str, cluster: str) -> None:
    # Asked for the pipeline mode by name (without --mode, the run goes hybrid: a stage may have
    # several devices).
    proc = run_cli(
        "central", "--broker", amqtt_url, "--cluster", cluster, "--workers", "9", "--mode", "pipeline"
    )
    assert_user_error(proc, "9 workers", "--workers", "--mode hybrid")


def test_central_with_an_unknown_model(amqtt_url: str, cluster: str) -> None:
    proc = run_cli("central", "--broker", amqtt_url, "--cluster", cluster, "--model", "resnet")
    assert_user_error(proc, "unknown model 'resnet'")


@pytest.mark.parametrize(
    "args",
    [
        ("broker", "--help", "0"),
        ("credentials", "add", "--credentials-dir", "{tmp}/creds", "pi-1", "0"),
        ("certs", "--certs-dir", "{tmp}/tls", "--host", "127.0.0.1", "--device", "pi-1", "0"),
        ("profile", "push", "--profiles-dir", "{tmp}/no-such-dir", "2"),  # the error path
    ],
    ids=lambda args: args[0],
)
def test_commands_that_train_nothing_do_not_import_torch(args: tuple[str, ...], tmp_path: Path) -> None:
    """Seconds on a Pi: the operator's commands start without it (edgeagent.cli.main.COMMANDS). (The
    monitor decodes the devices' messages, whose tensors need it.)"""
    argv, code_expected = [a.format(tmp=tmp_path) for a in args[:-1]], args[-1]
    code = (
        "import sys\n"
        "from edgeagent.cli.main import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit as exc:\n"
        "    print('exit', exc.code)\n"
        "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-2:] == [f"exit {code_expected}", "[]"], proc.stdout + proc.stderr


def test_the_program_exits_with_its_code_and_its_output_flushed(tmp_path: Path) -> None:
    """``python -m edgeagent`` leaves through os._exit (no interpreter teardown of torch): what a command
    printed to a pipe still arrives, and the exit status is the command's."""
    added = run_cli("credentials", "add", "--credentials-dir", str(tmp_path / "creds"), "pi-1")
    assert added.returncode == 0, added.stderr
    assert "added pi-1" in added.stderr and "password: " in added.stderr  # the console: stderr
    assert "edgeagent, version " in run_cli("--version").stdout  # stdout, a pipe: flushed
    assert run_cli("no-such-command").returncode == 2
