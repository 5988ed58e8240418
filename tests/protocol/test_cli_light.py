"""`edgeagent --help` and every command that trains nothing run without importing torch (seconds on a Pi
before any output), matplotlib or amqtt (which a worker's install does not have)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# Runs in a fresh interpreter: each step is one `edgeagent ...` command line, run in the same process one
# after the other; the first step after which a heavy module is in sys.modules is the one that imported it.
# The help of every command and subcommand is walked from the group, so a command added later is checked.
_DRIVER = r"""
import json, sys
import click
from edgeagent.cli.main import main

HEAVY = ("torch", "matplotlib", "amqtt", "sklearn", "scipy")
steps = [["--help"], ["--version"]]
ctx = click.Context(main)
for name in main.list_commands(ctx):
    command = main.get_command(ctx, name)
    steps.append([name, "--help"])
    if isinstance(command, click.Group):
        steps += [[name, sub, "--help"] for sub in command.list_commands(ctx)]
steps += json.loads(sys.argv[1])
seen, results = set(), []
for args in steps:
    try:
        main.main(args, prog_name="edgeagent", standalone_mode=False)
        code = 0
    except SystemExit as exc:
        code = exc.code
    new = [m for m in HEAVY if m in sys.modules and m not in seen]
    seen.update(new)
    results.append({"args": args, "code": code, "imported": new})
print("\n" + json.dumps(results))
"""


def test_help_and_the_commands_that_train_nothing_do_not_import_torch(
    tmp_path: Path, amqtt_url: str, cluster: str
) -> None:
    profiles = tmp_path / "devices"
    profiles.mkdir()
    (profiles / "dev-1.yaml").write_text("id: dev-1\nthreads: 1\n")
    access = ["--broker", amqtt_url, "--cluster", cluster, "--profiles-dir", str(profiles)]
    creds = ["--credentials-dir", str(tmp_path / "creds")]
    run = [
        ["certs", "--certs-dir", str(tmp_path / "site"), "--device", "dev-1"],
        ["credentials", "add", *creds, "dev-1", "--password-out", str(tmp_path / "passwords")],
        ["credentials", "list", *creds],
        ["profile", "push", *access],
        ["profile", "show", *access, "dev-1"],
        ["profile", "diff", *access, "dev-1"],
    ]
    out = subprocess.run(
        [sys.executable, "-c", _DRIVER, json.dumps(run)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout.splitlines()[-1])
    helps = [r for r in results if r["args"][-1] == "--help"]
    assert len(helps) > 10, helps  # the walk found the commands and their subcommands
    # Note: `profile push|show|diff` speak the wire protocol, whose codec (protocol/wire.py, messages.py)
    #     carries tensors and imports torch at the top: the one exception, kept last in the steps above.
    #     Not matplotlib or amqtt, though, which a worker's install does not have.
    speaks_wire = [r for r in results if r["args"][0] == "profile" and r["args"][-1] != "--help"]
    assert [r for r in results if r["imported"] and r not in speaks_wire] == []
    assert [m for r in speaks_wire for m in r["imported"]] == ["torch"]
    ran = {" ".join(r["args"][:2]): r["code"] for r in results if r["args"][-1] != "--help"}
    assert ran == {
        "--version": 0,
        "certs --certs-dir": 0,
        "credentials add": 0,
        "credentials list": 0,
        "profile push": 0,
        "profile show": 0,
        "profile diff": 0,
    }, out.stdout
    assert (tmp_path / "site" / "dev-1.pem").is_file()
    assert "pushed dev-1" in out.stderr and "threads: 1" in out.stderr  # rich console: stderr
