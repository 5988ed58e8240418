"""A fork server for the tests' worker processes: torch imported once, not once per worker.

Every integration test starts two to five ``python -m edgeagent worker`` processes, and each spends
about 1.8 s of CPU importing torch and edgeagent before it runs a line of its own: on 2 cores that was
most of the suite's time. Here one process per pytest process (the zygote) imports them once, and each
worker is a ``fork()`` of it running the same ``edgeagent.cli.main.entry`` a fresh interpreter would,
with the command line, environment, working directory and standard streams the test gave it. Real
processes still: their own pid, killed by SIGKILL, reaped, exit codes as ``subprocess.Popen`` reports
them. What a fork cannot copy (an interpreter option in the environment, a cgroup wrapper) gets a real
``subprocess.Popen`` (:func:`spawn` decides).

The zygote forks only from its single thread (torch's DataLoader workers fork the same way). The tests
watch and signal each worker through a pidfd (a recycled pid is never hit) and ask the zygote to reap it
once it has exited.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback
from typing import Any

# Read by the interpreter or by torch at start-up: a fork of the zygote would keep the zygote's.
_STARTUP_ENV = ("PYTHON", "OMP_", "MKL_", "KMP_", "TORCH", "LD_", "CUDA")
_FDS = 8  # the most descriptors one message carries
_ENTRY = [sys.executable, "-m", "edgeagent"]


def _send(sock: socket.socket, payload: dict[str, Any], fds: list[int] | None = None) -> None:
    data = json.dumps(payload).encode()
    if fds:
        sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        sock.send(data)


def _recv(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """One message and the descriptors it carries; (None, []) when the other side has gone."""
    fds = array.array("i")
    data, ancdata, _flags, _addr = sock.recvmsg(1 << 20, socket.CMSG_LEN(_FDS * fds.itemsize))
    for level, kind, cdata in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(cdata[: len(cdata) - (len(cdata) % fds.itemsize)])
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    return json.loads(data), list(fds)


# -- the zygote -----------------------------------------------------------------------------------------


def _run_child(request: dict[str, Any], stdio: list[int], keep_closed: list[int]) -> None:
    """In the forked child: become ``python -m edgeagent <args>`` and never return."""
    try:
        for fd in keep_closed:
            os.close(fd)
        for target, fd in enumerate(stdio):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[0] = request["cwd"]  # what ``python -m`` puts first
        sys.argv = ["edgeagent", *request["args"]]
        from edgeagent.cli.main import entry

        entry()  # exits the process (os._exit) with the command's code
    except BaseException:  # a bug: what the interpreter would print
        traceback.print_exc()
    finally:
        os._exit(1)


def _fork(request: dict[str, Any], stdio: list[int], sock: socket.socket) -> int:
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid = os.fork()
    if pid == 0:
        _run_child(request, stdio, [sock.fileno()])
    for fd in stdio:
        os.close(fd)
    return pid


def serve(fd: int) -> None:
    """The zygote's loop, one request at a time: fork a worker (its pid and a pidfd back), or reap one
    that has exited (its exit code back). A worker that exited stays a zombie until the tests reap it,
    as a ``subprocess.Popen`` child does: a signal to it is no error until then."""
    import torch  # noqa: F401  (what every worker needs first)

    import edgeagent.cli.main
    import edgeagent.cli.train
    import edgeagent.roles.worker  # noqa: F401

    sock = socket.socket(fileno=fd)
    while True:
        request, fds = _recv(sock)
        if request is None:  # the tests' process is gone: so is the zygote (not its workers)
            return
        if "reap" in request:
            _, status = os.waitpid(request["reap"], 0)
            _send(sock, {"code": os.waitstatus_to_exitcode(status)})
            continue
        pid = _fork(request, fds, sock)
        pidfd = os.pidfd_open(pid)
        _send(sock, {"pid": pid}, [pidfd])
        os.close(pidfd)


# -- the tests' side --------------------------------------------------------------------------------------


class Forked:
    """A worker forked by the zygote, with what the tests use of ``subprocess.Popen``."""

    def __init__(self, zygote: Zygote, pid: int, pidfd: int, args: list[str]) -> None:
        self.zygote, self.pid, self.pidfd, self.args = zygote, pid, pidfd, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self.pidfd], [], [], 0)[0]:
            self._finish()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self.pidfd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._finish()
        assert self.returncode is not None
        return self.returncode

    def _finish(self) -> None:
        self.returncode = self.zygote.exit_code(self.pid)
        os.close(self.pidfd)

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # exited, not reaped yet
                signal.pidfd_send_signal(self.pidfd, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """The tests' end of one zygote (started on first use, gone with the tests' process)."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.env = dict(os.environ)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", f"from tests.zygote import serve; serve({theirs.fileno()})"],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self.sock = ours
        self.lock = threading.Lock()

    def usable(self, cmd: list[str], env: dict[str, str]) -> bool:
        """Whether a fork can stand for ``cmd``: an ``edgeagent`` command whose start-up environment is the
        zygote's (else the interpreter or torch would have started differently)."""
        if cmd[: len(_ENTRY)] != _ENTRY or self.proc.poll() is not None:
            return False
        keys = {k for k in (*env, *self.env) if k.startswith(_STARTUP_ENV)}
        return all(env.get(k) == self.env.get(k) for k in keys)

    def spawn(self, cmd: list[str], env: dict[str, str]) -> Forked:
        request = {"args": cmd[len(_ENTRY) :], "env": env, "cwd": os.getcwd()}
        message, fds = self._ask(request, [0, 1, 2])
        return Forked(self, message["pid"], fds[0], cmd)

    def exit_code(self, pid: int) -> int:
        """``pid``'s exit code, reaped (its pidfd said it exited)."""
        return int(self._ask({"reap": pid})[0]["code"])

    def _ask(self, request: dict[str, Any], fds: list[int] | None = None) -> tuple[dict[str, Any], list[int]]:
        with self.lock:
            _send(self.sock, request, fds)
            message, got = _recv(self.sock)
        if message is None:
            raise RuntimeError(f"the zygote (pid {self.proc.pid}) is gone: exit code {self.proc.poll()}")
        return message, got

    def close(self) -> None:
        self.sock.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_zygote: Zygote | None = None
_started = threading.Lock()


def spawn(cmd: list[str], env: dict[str, str]) -> Forked | subprocess.Popen[bytes]:
    """``subprocess.Popen(cmd, env=env)``, as a fork of the zygote where that is the same thing."""
    global _zygote
    if cmd[: len(_ENTRY)] != _ENTRY:  # not an edgeagent command: no zygote started for it
        return subprocess.Popen(cmd, env=env)
    with _started:
        if _zygote is None:
            _zygote = Zygote()
        zygote = _zygote
    if not zygote.usable(cmd, env):
        return subprocess.Popen(cmd, env=env)
    return zygote.spawn(cmd, env)


def close() -> None:
    """Stop the zygote (the workers it forked go on until they exit)."""
    global _zygote
    with _started:
        if _zygote is not None:
            _zygote.close()
            _zygote = None
