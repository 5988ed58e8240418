"""Transport benchmark: Activation encode/decode speed and tensor round trips over four paths.

Prints, in one run:

* MiB/s for ``encode`` + ``decode`` of an :class:`~edgeagent.protocol.messages.Activation` carrying a
  4 MiB float32 tensor (also encode-only and decode-only);
* the round trip of Activations with 1 MiB and 4 MiB tensors, with each path's hop count:

  ====================  ===================================================  ====
  path                  route of one round trip                              hops
  ====================  ===================================================  ====
  ``tcp``               A -> B -> A over plain TCP                              2
  ``tcp relay``         A -> relay -> B -> relay -> A over plain TCP            4
  ``amqtt``             A -> broker -> B -> broker -> A (embedded broker)       4
  ``mosquitto``         A -> broker -> B -> broker -> A (Mosquitto)             4
  ====================  ===================================================  ====

  The brokers are compared with ``tcp relay``, the TCP path with the same hops (a broker forwards
  every message, so a broker path has twice the hops of a direct socket); the direct socket is shown
  as the floor.

Client A runs in this process; echo end B in a subprocess (``--echo thread``: a thread of this
process); the broker or the relay in a process of its own. MQTT round trips use
:class:`~edgeagent.transport.mqtt.MqttTransport` on both ends (QoS 1, default chunk size), so a 4 MiB
tensor travels as 6 chunks each way and is reassembled and verified (SHA-256) on both sides: A publishes
the already-encoded message on ``ping``; B republishes the bytes on ``pong``; A times publish -> whole
``pong`` payload delivered. The TCP paths send the same bytes, length-prefixed and unchunked; the relay
receives each whole frame before it forwards it (store and forward, as a broker), without a broker's
QoS, chunking or topic matching. Mosquitto runs with the project's ``broker/mosquitto.conf`` (see
docs/brokers.md: ``set_tcp_nodelay true``, ``message_size_limit``, ``max_queued_messages``,
``persistence false``), only its listener moved to a free port; the embedded broker runs as
``python -m edgeagent broker``.

Usage: ``python bench/transport.py [--repeats N] [--json FILE] [--echo {process,thread}]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

MIB = 1024 * 1024
SIZES_MIB = (1, 4)
ENCODE_MIB = 4
ROUND_TIMEOUT = 30.0  # seconds one round trip may take before the benchmark gives up
_LEN = struct.Struct("!Q")
MOSQUITTO_CONF = Path(__file__).resolve().parents[1] / "broker" / "mosquitto.conf"
# Network hops of one round trip: A -> B -> A direct; through a broker or the relay, each way is two.
HOPS = {"tcp": 2, "tcp relay": 4, "amqtt": 4, "mosquitto": 4}
LIKE_FOR_LIKE = "tcp relay"  # the TCP path with the brokers' hop count

EchoMode = Literal["process", "thread"]


# ---------------------------------------------------------------------------------------------
# Helpers


@dataclass(frozen=True)
class Stats:
    median_ms: float
    p90_ms: float
    min_ms: float
    mib_per_s: float  # effective, from the median: 2 x payload / rtt for round trips

    @classmethod
    def of(cls, seconds: list[float], mib_moved: float) -> Stats:
        ordered = sorted(seconds)
        med = statistics.median(ordered)
        p90 = ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]  # nearest rank
        return cls(1e3 * med, 1e3 * p90, 1e3 * ordered[0], mib_moved / med)


def _activation(tensor_mib: int) -> Any:
    """An Activation whose float32 tensor ``x`` is exactly ``tensor_mib`` MiB (plus 64 int64 labels)."""
    import torch

    from edgeagent.protocol.messages import Activation

    rows = 64
    cols = tensor_mib * MIB // 4 // rows
    gen = torch.Generator().manual_seed(tensor_mib)
    return Activation(
        run_id="bench",
        plan_id=1,
        stage=0,
        batch_id=7,
        version=3,
        mode="train",
        x=torch.randn(rows, cols, generator=gen),
        y=torch.randint(0, 10, (rows,), generator=gen),
    )


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """Block until something listens on 127.0.0.1:``port``; fail early if ``proc`` exits first."""
    deadline = time.monotonic() + timeout
    gate = threading.Event()  # never set: only its timed wait paces the polling
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} before listening on {port}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        gate.wait(0.05)
    raise RuntimeError(f"nothing listened on 127.0.0.1:{port} within {timeout:.0f} s")


def _stop_process(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


# ---------------------------------------------------------------------------------------------
# Encoding


def bench_encoding(repeats: int) -> dict[str, Stats]:
    import torch

    from edgeagent.protocol.messages import Activation
    from edgeagent.protocol.wire import decode, encode

    msg = _activation(ENCODE_MIB)
    wire = encode(msg, sender="bench")
    _, back = decode(wire)  # warm-up, and a check that the benchmark measures a correct round trip
    same = isinstance(back, Activation) and torch.equal(back.tensor, msg.tensor)
    if not (same and isinstance(back, Activation) and torch.equal(back.y, msg.y)):
        raise RuntimeError("decode(encode(activation)) did not give the activation back")
    enc: list[float] = []
    dec: list[float] = []
    both: list[float] = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        payload = encode(msg, sender="bench")
        t1 = time.perf_counter()
        decode(payload)
        t2 = time.perf_counter()
        enc.append(t1 - t0)
        dec.append(t2 - t1)
        both.append(t2 - t0)
    return {
        "encode+decode": Stats.of(both, ENCODE_MIB),
        "encode": Stats.of(enc, ENCODE_MIB),
        "decode": Stats.of(dec, ENCODE_MIB),
    }


# ---------------------------------------------------------------------------------------------
# Plain TCP


def _recv_exact(sock: socket.socket, buf: memoryview) -> bool:
    """Fill ``buf`` from ``sock``; False if the peer closed first."""
    got = 0
    while got < len(buf):
        n = sock.recv_into(buf[got:])
        if n == 0:
            return False
        got += n
    return True


def _recv_frame(sock: socket.socket) -> bytearray | None:
    head = bytearray(_LEN.size)
    if not _recv_exact(sock, memoryview(head)):
        return None
    (size,) = _LEN.unpack(head)
    body = bytearray(size)
    return body if _recv_exact(sock, memoryview(body)) else None


def _send_frame(sock: socket.socket, frame: bytes | bytearray) -> None:
    sock.sendall(_LEN.pack(len(frame)))
    sock.sendall(frame)


def _nodelay(sock: socket.socket) -> socket.socket:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _echo_frames(conn: socket.socket) -> None:
    """Send every length-prefixed frame on ``conn`` straight back until the peer closes."""
    with contextlib.suppress(OSError), conn:
        _nodelay(conn)
        while (frame := _recv_frame(conn)) is not None:
            _send_frame(conn, frame)


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Store and forward: receive each whole frame from ``src``, then send it on ``dst`` (as a broker
    forwards a whole message); when ``src`` closes, shut both down so the other direction ends too."""
    with contextlib.suppress(OSError):
        while (frame := _recv_frame(src)) is not None:
            _send_frame(dst, frame)
    for sock in (src, dst):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _relay_frames(conn: socket.socket, upstream: int) -> None:
    """One relayed connection: frames from ``conn`` go to a new connection to ``upstream``, and back."""
    with (
        contextlib.suppress(OSError),
        conn,
        _nodelay(socket.create_connection(("127.0.0.1", upstream))) as up,
    ):
        _nodelay(conn)
        back = threading.Thread(target=_pump, args=(up, conn), name="relay-back", daemon=True)
        back.start()
        _pump(conn, up)
        back.join()


def _serve(listener: socket.socket, handle: Callable[[socket.socket], None]) -> None:
    """Accept connections until ``listener`` closes; each one is handled on its own thread (probes of
    ``_wait_port`` connect and close at once)."""
    with contextlib.suppress(OSError):  # the listener is closed under us at exit
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=handle, args=(conn,), daemon=True).start()


class TcpEcho:
    """Echo end B of the TCP paths, as a loopback server thread of this process."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._thread = threading.Thread(
            target=_serve, args=(self._listener, _echo_frames), name="tcp-echo", daemon=True
        )

    def __enter__(self) -> TcpEcho:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._listener.close()
        self._thread.join(5)


@contextlib.contextmanager
def _helper_process(role: str, *args: str) -> Iterator[int]:
    """This script as a ``--_tcp ROLE PORT ...`` subprocess listening on a free port; yields the port."""
    from edgeagent.broker import free_port

    port = free_port()
    cmd = [sys.executable, os.path.abspath(__file__), "--_tcp", role, str(port), *args]
    proc = subprocess.Popen(cmd)
    try:
        _wait_port(port, proc)
        yield port
    finally:
        _stop_process(proc)


@contextlib.contextmanager
def tcp_echo(mode: EchoMode) -> Iterator[int]:
    """Echo end B in a subprocess (as the MQTT paths' echo client) or on a thread here; yields its port."""
    if mode == "process":
        with _helper_process("echo") as port:
            yield port
        return
    with TcpEcho() as server:
        yield server.port


def _tcp_main(role: str, port: int, upstream: int | None) -> None:
    """Entry point of the TCP helper subprocesses: an echo end, or a relay to ``upstream``; they serve
    until the parent terminates them."""
    listener = socket.create_server(("127.0.0.1", port))
    if role == "echo":
        _serve(listener, _echo_frames)
    else:
        assert upstream is not None
        _serve(listener, lambda conn: _relay_frames(conn, upstream))


def bench_tcp(payloads: dict[int, bytes], repeats: int, echo: EchoMode, *, relay: bool) -> dict[int, Stats]:
    """Round trips A -> B -> A over TCP (2 hops), or with ``relay`` A -> relay -> B -> relay -> A (4
    hops, like A -> broker -> B -> broker -> A), the relay a process of its own like a broker."""
    out: dict[int, Stats] = {}
    with contextlib.ExitStack() as stack:
        port = stack.enter_context(tcp_echo(echo))
        if relay:
            port = stack.enter_context(_helper_process("relay", str(port)))
        sock = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=ROUND_TIMEOUT))
        _nodelay(sock)
        for mib, payload in payloads.items():
            times: list[float] = []
            for i in range(repeats + 1):  # round 0 is the warm-up
                t0 = time.perf_counter()
                _send_frame(sock, payload)
                back = _recv_frame(sock)
                t1 = time.perf_counter()
                if back is None or (i == 0 and back != payload):
                    raise RuntimeError(f"the TCP echo of the {mib} MiB payload came back wrong")
                if i:
                    times.append(t1 - t0)
            out[mib] = Stats.of(times, 2 * len(payload) / MIB)
    return out


# ---------------------------------------------------------------------------------------------
# MQTT


def run_echo(
    url: str, ping: str, pong: str, stop: threading.Event, ready: threading.Event | None = None
) -> None:
    """Echo client B: republish every whole payload from ``ping`` on ``pong`` until ``stop`` is set."""
    from edgeagent.transport.mqtt import MqttTransport

    echo = MqttTransport(url, f"bench-echo-{uuid.uuid4().hex[:8]}")
    try:
        if not echo.wait_connected(15):
            raise RuntimeError(f"the echo client could not connect to {url}")
        echo.subscribe(ping, lambda _topic, payload: echo.publish(pong, payload))
        if ready is not None:
            ready.set()
        stop.wait()
    finally:
        echo.close()


@contextlib.contextmanager
def echo_client(mode: EchoMode, url: str, ping: str, pong: str) -> Iterator[None]:
    """Run echo client B in a subprocess (it exits when its stdin closes) or on a thread here."""
    if mode == "process":
        cmd = [sys.executable, os.path.abspath(__file__), "--_echo", url, ping, pong]
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE)
        try:
            yield
        finally:
            if proc.stdin is not None:
                proc.stdin.close()  # the child's cue to disconnect and exit
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                _stop_process(proc)
        return
    stop, ready = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            run_echo(url, ping, pong, stop, ready)
        except BaseException as exc:
            errors.append(exc)
            ready.set()

    thread = threading.Thread(target=target, name="mqtt-echo", daemon=True)
    thread.start()
    try:
        ready.wait(20)
        if errors:
            raise RuntimeError(f"echo thread failed: {errors[0]}") from errors[0]
        yield
    finally:
        stop.set()
        thread.join(10)


class Pinger:
    """Client A: publishes on ``ping``; notes when a whole payload of the expected size lands on ``pong``."""

    def __init__(self, url: str, ping: str, pong: str) -> None:
        from edgeagent.transport.mqtt import MqttTransport

        self.ping = ping
        self._arrived = threading.Event()
        self._expect = -1
        self._arrival = 0.0
        self._last: bytes = b""
        self._transport = MqttTransport(url, f"bench-ping-{uuid.uuid4().hex[:8]}")
        if not self._transport.wait_connected(15):
            self._transport.close()
            raise RuntimeError(f"the benchmark client could not connect to {url}")
        self._transport.subscribe(pong, self._on_pong)

    def _on_pong(self, _topic: str, payload: bytes) -> None:
        t = time.perf_counter()
        # Late echoes of readiness probes (or of a timed-out round) must not end the wrong round.
        if len(payload) == self._expect:
            self._arrival = t
            self._last = payload
            self._arrived.set()

    def round_trip(self, payload: bytes, timeout: float = ROUND_TIMEOUT) -> float | None:
        """Seconds from publish to the echo's arrival, or None after ``timeout``."""
        self._arrived.clear()
        self._expect = len(payload)
        t0 = time.perf_counter()
        self._transport.publish(self.ping, payload)
        if not self._arrived.wait(timeout):
            return None
        return self._arrival - t0

    def wait_for_echo(self, timeout: float = 20.0) -> None:
        """Probe until the echo client is subscribed (SUBACKs are not exposed by the transport)."""
        deadline = time.monotonic() + timeout
        probe = b"probe"
        while time.monotonic() < deadline:
            if self.round_trip(probe, timeout=0.25) is not None:
                return
        raise RuntimeError(f"no echo on {self.ping} within {timeout:.0f} s")

    def last_payload(self) -> bytes:
        return self._last

    def close(self) -> None:
        self._transport.close()


def bench_mqtt(url: str, payloads: dict[int, bytes], repeats: int, echo: EchoMode) -> dict[int, Stats]:
    base = f"bench/{uuid.uuid4().hex[:8]}"
    ping, pong = f"{base}/ping", f"{base}/pong"
    out: dict[int, Stats] = {}
    with echo_client(echo, url, ping, pong):
        pinger = Pinger(url, ping, pong)
        try:
            pinger.wait_for_echo()
            for mib, payload in payloads.items():
                times: list[float] = []
                for i in range(repeats + 1):  # round 0 is the warm-up
                    rtt = pinger.round_trip(payload)
                    if rtt is None:
                        raise RuntimeError(f"no echo of the {mib} MiB payload within {ROUND_TIMEOUT:.0f} s")
                    if i == 0 and pinger.last_payload() != payload:
                        raise RuntimeError(f"the echo of the {mib} MiB payload came back altered")
                    if i:
                        times.append(rtt)
                out[mib] = Stats.of(times, 2 * len(payload) / MIB)
        finally:
            pinger.close()
    return out


@contextlib.contextmanager
def amqtt_broker() -> Iterator[str]:
    """``python -m edgeagent broker`` on a free port, in its own process (its own GIL)."""
    from edgeagent.broker import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "edgeagent", "broker", "--port", str(port), "--log-level", "WARNING"]
    proc = subprocess.Popen(cmd)
    try:
        _wait_port(port, proc)
        yield f"mqtt://127.0.0.1:{port}"
    finally:
        _stop_process(proc)


def mosquitto_conf(port: int) -> str:
    """The project's Mosquitto configuration (``broker/mosquitto.conf``, see docs/brokers.md), with its
    listener moved to ``port`` and errors logged to stderr; every other setting as documented
    (message_size_limit, max_queued_messages, set_tcp_nodelay true, persistence false)."""
    lines = []
    for line in MOSQUITTO_CONF.read_text().splitlines():
        if line.split()[:1] == ["listener"]:
            line = f"listener {port} 127.0.0.1"
        lines.append(line)
    if not any(line.startswith("listener ") for line in lines):
        raise RuntimeError(f"{MOSQUITTO_CONF} has no listener line to move to port {port}")
    return "\n".join([*lines, "log_dest stderr", "log_type error", ""])


def mosquitto_settings() -> list[str]:
    """The documented settings in force (the config's non-comment lines but the listener)."""
    lines = (line.strip() for line in MOSQUITTO_CONF.read_text().splitlines())
    return [line for line in lines if line and not line.startswith(("#", "listener"))]


@contextlib.contextmanager
def mosquitto_broker() -> Iterator[str]:
    """A private Mosquitto on a free loopback port, run with the project's ``broker/mosquitto.conf``."""
    from edgeagent.broker import free_port

    port = free_port()
    with tempfile.TemporaryDirectory(prefix="bench-mosquitto-") as tmp:
        conf = Path(tmp) / "mosquitto.conf"
        conf.write_text(mosquitto_conf(port))
        proc = subprocess.Popen(["mosquitto", "-c", str(conf)], stderr=subprocess.DEVNULL)
        try:
            _wait_port(port, proc)
            yield f"mqtt://127.0.0.1:{port}"
        finally:
            _stop_process(proc)


# ---------------------------------------------------------------------------------------------
# Report


def _table(rows: list[list[str]], align: str) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        cells = [c.ljust(w) if a == "<" else c.rjust(w) for c, w, a in zip(row, widths, align, strict=True)]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def report(
    encoding: dict[str, Stats],
    trips: dict[str, dict[int, Stats] | str],
    payload_sizes: dict[int, int],
    repeats: int,
    echo: EchoMode,
) -> str:
    out = [f"Activation encode/decode, {ENCODE_MIB} MiB float32 tensor, median of {repeats}", ""]
    rows = [["operation", "median ms", "p90 ms", "MiB/s"]]
    for name, s in encoding.items():
        rows.append([name, f"{s.median_ms:.1f}", f"{s.p90_ms:.1f}", f"{s.mib_per_s:,.0f}"])
    out += [_table(rows, "<>>>"), ""]

    sizes = ", ".join(f"{m} MiB tensor = {n:,} B" for m, n in payload_sizes.items())
    where = "a subprocess" if echo == "process" else "a thread of this process"
    out.append(f"Round trip of an encoded Activation ({sizes}), median of {repeats} after 1 warm-up")
    out.append(f"client A here; echo end B in {where}; broker or relay in a process of its own")
    out.append("MQTT: MqttTransport on A and B, QoS 1, default chunk size (chunks checked by SHA-256)")
    conf = MOSQUITTO_CONF.relative_to(MOSQUITTO_CONF.parents[1])
    out.append(f"Mosquitto: {conf}: {'; '.join(mosquitto_settings())}")
    out.append("TCP: the same bytes, length-prefixed, unchunked; the relay stores and forwards whole frames")
    out.append(
        f"MiB/s = 2 x payload / median rtt;  'x relay' = median rtt / {LIKE_FOR_LIKE} median rtt (same hops)"
    )
    out.append("")
    head = ["path", "hops"]
    for m in SIZES_MIB:
        head += [f"{m} MiB med ms", "p90 ms", "MiB/s", "x relay"]
    rows = [head]
    base = trips.get(LIKE_FOR_LIKE)
    for path, result in trips.items():
        row = [path, str(HOPS[path])]
        for m in SIZES_MIB:
            if isinstance(result, str):
                row += ["-", "-", "-", "-"]
                continue
            s = result[m]
            ratio = f"{s.median_ms / base[m].median_ms:.1f}x" if isinstance(base, dict) else "-"
            row += [f"{s.median_ms:.2f}", f"{s.p90_ms:.2f}", f"{s.mib_per_s:,.0f}", ratio]
        rows.append(row)
    out.append(_table(rows, "<>" + ">>>>" * len(SIZES_MIB)))
    notes = [f"  {path}: {result}" for path, result in trips.items() if isinstance(result, str)]
    if notes:
        out += ["", "skipped:", *notes]
    out.append("")
    for path, result in trips.items():
        if not isinstance(result, dict) or path in ("tcp", LIKE_FOR_LIKE):
            continue
        ratios = []
        for ref in (LIKE_FOR_LIKE, "tcp"):
            other = trips.get(ref)
            if isinstance(other, dict):
                each = ", ".join(
                    f"{m} MiB {result[m].median_ms / other[m].median_ms:.1f}x" for m in SIZES_MIB
                )
                ratios.append(f"{each} the {ref} ({HOPS[ref]} hops)")
        out.append(f"  {path} ({HOPS[path]} hops): {'; '.join(ratios)}")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Main


def _echo_main(url: str, ping: str, pong: str) -> None:
    """Entry point of the echo subprocess: serve until stdin closes (the parent is done or dead)."""
    stop = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.buffer.read()
        stop.set()

    threading.Thread(target=watch_stdin, name="stdin-watch", daemon=True).start()
    run_echo(url, ping, pong, stop)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=30, help="timed rounds per measurement (default 30)")
    parser.add_argument("--json", metavar="FILE", help="also write the numbers to FILE")
    parser.add_argument(
        "--echo", choices=("process", "thread"), default="process", help="where echo end B runs"
    )
    parser.add_argument("--_echo", nargs=3, metavar=("URL", "PING", "PONG"), help=argparse.SUPPRESS)
    parser.add_argument("--_tcp", nargs="+", metavar="ROLE PORT [UPSTREAM]", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._echo:
        _echo_main(*args._echo)
        return 0
    if args._tcp:
        role, port, *upstream = args._tcp
        _tcp_main(role, int(port), int(upstream[0]) if upstream else None)
        return 0
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")

    from edgeagent.protocol.wire import encode

    started = time.perf_counter()
    encoding = bench_encoding(args.repeats)
    payloads = {m: encode(_activation(m), sender="bench") for m in SIZES_MIB}

    trips: dict[str, dict[int, Stats] | str] = {
        "tcp": bench_tcp(payloads, args.repeats, args.echo, relay=False),
        "tcp relay": bench_tcp(payloads, args.repeats, args.echo, relay=True),
    }
    brokers: list[tuple[str, Callable[[], contextlib.AbstractContextManager[str]]]] = [
        ("amqtt", amqtt_broker),
        ("mosquitto", mosquitto_broker),
    ]
    for name, start_broker in brokers:
        if name == "mosquitto" and shutil.which("mosquitto") is None:
            trips[name] = "the mosquitto binary is not installed (apt-get install mosquitto)"
            continue
        with start_broker() as url:
            trips[name] = bench_mqtt(url, payloads, args.repeats, args.echo)

    print(report(encoding, trips, {m: len(p) for m, p in payloads.items()}, args.repeats, args.echo))
    print(f"\n(total {time.perf_counter() - started:.1f} s)")
    if args.json:
        data = {
            "repeats": args.repeats,
            "echo": args.echo,
            "payload_bytes": {f"{m}MiB": len(p) for m, p in payloads.items()},
            "hops": {path: HOPS[path] for path in trips},
            "mosquitto_settings": mosquitto_settings(),
            "encoding": {k: asdict(v) for k, v in encoding.items()},
            "round_trip": {
                path: (r if isinstance(r, str) else {f"{m}MiB": asdict(s) for m, s in r.items()})
                for path, r in trips.items()
            },
        }
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
