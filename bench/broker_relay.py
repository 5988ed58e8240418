"""The broker's CPU per relayed message: the embedded amqtt broker with amqtt's own relay loop, with ours
(edgeagent/broker/relay.py: the same loop without its per-message debug formatting), and Mosquitto.

    python bench/broker_relay.py [--messages 3000] [--sizes 100,16384,262144] [--repeats 3]

Each arm is a broker process of its own on a free port; one publisher and one subscriber (paho, QoS 1, as
edgeagent's activations and gradients) in this process; the subscriber also holds 8 filters that do not
match, as a role's subscriptions do. The publisher keeps at most 20 messages unacknowledged. The figure is
the broker process's CPU time (user + system, /proc) over the messages, per message: PUBLISH in, PUBACK
out, PUBLISH out, PUBACK in. Arms alternate within each repeat; medians of ``--repeats``. Mosquitto is
the C broker as edgeagent's bench configures it (``set_tcp_nodelay true``); it is what the embedded
broker can be compared with, not a baseline of a paper (the papers run no broker of their own).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgeagent.broker import free_port
from edgeagent.broker.mosquitto import MosquittoProcess

# The embedded broker in a child process; "stock" keeps amqtt's own relay loop.
_CHILD = """
import signal, sys, threading
from edgeagent.broker import embedded
if sys.argv[2] == "stock":
    embedded.relay_applies = lambda version: False
broker = embedded.EmbeddedBroker("127.0.0.1", int(sys.argv[1])).start()
print("ready", flush=True)
done = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: done.set())
done.wait()
broker.stop()
"""
WINDOW = 20  # messages the publisher keeps unacknowledged at most


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def relay(port: int, pid: int, messages: int, size: int) -> float:
    """Broker CPU microseconds per message for ``messages`` of ``size`` bytes through 127.0.0.1:``port``."""
    received, warm = threading.Event(), threading.Event()
    count = [0]

    def on_message(client: mqtt.Client, userdata: object, message: mqtt.MQTTMessage) -> None:
        if message.topic == "bench/data/warm":
            warm.set()
            return
        count[0] += 1
        if count[0] == messages:
            received.set()

    subscribed = threading.Event()
    sub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"bench-sub-{port}")
    sub.on_message = on_message
    sub.on_subscribe = lambda *args: subscribed.set()
    sub.connect("127.0.0.1", port)
    sub.loop_start()
    # One SUBSCRIBE: its SUBACK says every filter is in place.
    sub.subscribe([(f"bench/other/{i}/+", 1) for i in range(8)] + [("bench/data/#", 1)])
    pub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"bench-pub-{port}")
    pub.connect("127.0.0.1", port)
    pub.loop_start()
    try:
        if not subscribed.wait(30):
            raise RuntimeError("the broker did not acknowledge the subscriptions in 30 s")
        payload = os.urandom(size)
        pub.publish("bench/data/warm", payload, qos=1)  # the connections warm, the route known
        if not warm.wait(30):
            raise RuntimeError("the warm-up message did not come through in 30 s")
        before = cpu_seconds(pid)
        window: list[mqtt.MQTTMessageInfo] = []
        for i in range(messages):
            window.append(pub.publish(f"bench/data/{i % 4}", payload, qos=1))
            if len(window) >= WINDOW:
                window.pop(0).wait_for_publish(30)
        if not received.wait(120):
            raise RuntimeError(f"the subscriber got {count[0]} of {messages} messages in 120 s")
        return 1e6 * (cpu_seconds(pid) - before) / messages
    finally:
        pub.disconnect()
        sub.disconnect()
        pub.loop_stop()
        sub.loop_stop()


def amqtt_arm(loop: str, messages: int, size: int) -> float:
    port = free_port()
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(port), loop], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        if child.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the {loop} broker did not start")
        return relay(port, child.pid, messages, size)
    finally:
        child.terminate()
        child.wait(30)


def mosquitto_arm(messages: int, size: int) -> float:
    with tempfile.TemporaryDirectory() as tmp, MosquittoProcess(Path(tmp), nodelay=True) as broker:
        assert broker.proc is not None
        return relay(broker.port, broker.proc.pid, messages, size)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--sizes", default="100,16384,262144")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    arms = {
        "amqtt, its own relay loop": lambda n, s: amqtt_arm("stock", n, s),
        "amqtt, edgeagent's relay loop": lambda n, s: amqtt_arm("ours", n, s),
        "Mosquitto (set_tcp_nodelay)": mosquitto_arm,
    }
    results: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.repeats):
        for size in sizes:
            for name, arm in arms.items():
                n = args.messages if size <= 65536 else max(200, args.messages // 4)
                results.setdefault((name, size), []).append(arm(n, size))
    print(
        f"broker CPU per relayed QoS 1 message, us (median of {args.repeats}); {time.strftime('%F')}"
    )
    print(f"{'broker':32s}" + "".join(f"{size:>12d} B" for size in sizes))
    for name in arms:
        print(f"{name:32s}" + "".join(f"{statistics.median(results[(name, s)]):14.0f}" for s in sizes))
    stock, ours = list(arms)[:2]
    ratios = [statistics.median(results[(stock, s)]) / statistics.median(results[(ours, s)]) for s in sizes]
    print(f"{'amqtt own / edgeagent loop':32s}" + "".join(f"{r:13.2f}x" for r in ratios))


if __name__ == "__main__":
    main()
