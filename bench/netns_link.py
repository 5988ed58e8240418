"""Does ``--link-mbps`` tell the truth? The same link measured behind a kernel rate limit and behind ours.

    sudo python bench/netns_link.py [--mbps 4]      (root: creates a network namespace and a veth pair)

A "device" runs in its own network namespace, joined to this host by a veth pair whose namespace end
is shaped with ``tc tbf`` to ``--mbps``; a private Mosquitto listens on the host end of the pair. The
device measures its link to an echo peer on the host with edgeagent's own link probe
(device -> broker -> peer). The same probe then runs on loopback with the application-level
throttle (``MqttTransport(link_mbps=...)``) and without any limit. The first two should agree.
Only addresses this script creates (10.231.0.0/30) are used; everything is removed at the end.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.netlab import NetnsLink, add_link, in_netns, remove_link, shape

HOST_IP, NS_IP = "10.231.0.1", "10.231.0.2"
LINK = NetnsLink("ea-bench-ns", "ea-bench-h", "ea-bench-n", f"{NS_IP}/30", host_addr=f"{HOST_IP}/30")

PROBE = """
import sys, threading
from edgeagent.protocol.topics import Topics
from edgeagent.runtime.probes import LinkProbes
from edgeagent.runtime.role import Role
from edgeagent.transport.mqtt import MqttTransport
url, mbps = sys.argv[1], float(sys.argv[2])
topics = Topics("netns")
echo = Role(MqttTransport(url, "echo"), topics, "peer")
dev = Role(MqttTransport(url, "dev", link_mbps=mbps), topics, "device")
assert echo.transport.wait_connected(10) and dev.transport.wait_connected(10)
LinkProbes(echo).watch("device")  # the peer echoes the device's probes
bw, lat = LinkProbes(dev).measure("peer")
print(f"{bw:.0f} {lat:.6f}")
"""


def probe(url: str, mbps: float, netns: bool = False) -> tuple[float, float]:
    cmd = [sys.executable, "-c", PROBE, url, str(mbps)]
    if netns:
        cmd = in_netns(LINK.ns, *cmd)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120).stdout.split()
    return float(out[0]), float(out[1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mbps", type=float, default=4.0)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    conf = tmp / "mosquitto.conf"
    conf.write_text(
        f"listener 18830 {HOST_IP}\nlistener 18831 127.0.0.1\nallow_anonymous true\n"
        "persistence false\nset_tcp_nodelay true\n"
    )
    broker = None
    try:
        add_link(LINK)
        # Shape what the device sends (its uplink), like the application-level throttle does.
        shape(LINK.ns_if, mbps=args.mbps, ns=LINK.ns, burst="16kb", latency="2s")
        broker = subprocess.Popen(["mosquitto", "-c", str(conf)], stderr=subprocess.DEVNULL)
        time.sleep(0.5)  # mosquitto has no readiness signal; the probes retry their connection anyway
        # The device's transport lives in the namespace; its echo peer too (both reach the broker on
        # the host end), so the device's uplink is the shaped one.
        tc_bw, tc_lat = probe(f"mqtt://{HOST_IP}:18830", 0.0, netns=True)
        app_bw, app_lat = probe("mqtt://127.0.0.1:18831", args.mbps)
        raw_bw, raw_lat = probe("mqtt://127.0.0.1:18831", 0.0)
    finally:
        if broker is not None:
            broker.terminate()
            broker.wait(10)
        remove_link(LINK)
    nominal = args.mbps * 1e6 / 8
    print(f"link of {args.mbps} Mbit/s = {nominal / 1e6:.3f} MB/s, measured with edgeagent's link probe:")
    print(f"{'':<36}{'MB/s':>8}{'of nominal':>12}{'latency ms':>12}")
    for name, bw, lat in (
        ("kernel: netns + veth + tc tbf", tc_bw, tc_lat),
        ("edgeagent: --link-mbps throttle", app_bw, app_lat),
        ("loopback, no limit", raw_bw, raw_lat),
    ):
        print(f"{name:<36}{bw / 1e6:>8.3f}{bw / nominal:>11.2f}x{1e3 * lat:>12.2f}")
    print(f"throttle / kernel shaping = {app_bw / tc_bw:.2f} (1.00 = the throttle tells the truth)")


if __name__ == "__main__":
    main()
