"""Network namespaces, veth pairs, a bridge and ``tc`` shaping for the benchmarks that need root.

Used by ``bench/netns_link.py`` (one device behind ``tc tbf``) and ``bench/pi_lab.py`` (a lab of
devices on one bridge). Everything here shells out to ``ip`` and ``tc`` (iproute2) and touches only the
names and addresses its caller passes in; every ``remove_*`` ignores what is already gone, so the same
calls clean up after a run that crashed half-way.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

__all__ = [
    "NetnsLink",
    "add_bridge",
    "add_link",
    "in_netns",
    "netns_names",
    "remove_bridge",
    "remove_link",
    "sh",
    "shape",
]


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``; on failure (with ``check``) the error names the command and what it printed."""
    done = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done


def in_netns(ns: str | None, *cmd: str) -> list[str]:
    """``cmd`` run inside network namespace ``ns`` (``ip netns exec`` execs it: same pid); None: as is."""
    return ["ip", "netns", "exec", ns, *cmd] if ns else list(cmd)


@dataclass(frozen=True)
class NetnsLink:
    """A network namespace joined to the root namespace by a veth pair.

    ``ns_addr`` (and ``host_addr``) are CIDR addresses such as ``10.231.0.2/30``. With ``bridge`` the
    host end becomes a port of that bridge (which holds the root namespace's address) and ``host_addr``
    stays None: several namespaces then share one subnet, like devices on one switch.
    """

    ns: str
    host_if: str
    ns_if: str
    ns_addr: str
    host_addr: str | None = None
    bridge: str | None = None

    def __post_init__(self) -> None:
        for name in (self.host_if, self.ns_if):
            if len(name) > 15:  # IFNAMSIZ - 1
                raise ValueError(f"interface name {name!r} is longer than 15 characters")
        if (self.host_addr is None) == (self.bridge is None):
            raise ValueError("give the host end either an address or a bridge, not both or neither")

    @property
    def ns_ip(self) -> str:
        return self.ns_addr.split("/")[0]


def netns_names() -> list[str]:
    """The network namespaces ``ip netns`` knows by name."""
    return [line.split()[0] for line in sh("ip", "netns", "list").stdout.splitlines() if line.strip()]


def add_bridge(name: str, addr: str) -> None:
    """A bridge in the root namespace holding ``addr`` (CIDR), up."""
    sh("ip", "link", "add", name, "type", "bridge")
    sh("ip", "addr", "add", addr, "dev", name)
    sh("ip", "link", "set", name, "up")


def remove_bridge(name: str) -> None:
    sh("ip", "link", "del", name, check=False)


def add_link(link: NetnsLink) -> None:
    """Create the namespace, the veth pair and the addresses, and bring everything up (``lo`` too)."""
    sh("ip", "netns", "add", link.ns)
    sh("ip", "link", "add", link.host_if, "type", "veth", "peer", "name", link.ns_if)
    sh("ip", "link", "set", link.ns_if, "netns", link.ns)
    if link.bridge is not None:
        sh("ip", "link", "set", link.host_if, "master", link.bridge)
    else:
        assert link.host_addr is not None
        sh("ip", "addr", "add", link.host_addr, "dev", link.host_if)
    sh("ip", "link", "set", link.host_if, "up")
    sh(*in_netns(link.ns, "ip", "addr", "add", link.ns_addr, "dev", link.ns_if))
    sh(*in_netns(link.ns, "ip", "link", "set", link.ns_if, "up"))
    sh(*in_netns(link.ns, "ip", "link", "set", "lo", "up"))


def remove_link(link: NetnsLink) -> None:
    """Delete the namespace and the host end of the pair (the other end goes with its namespace once no
    process runs in it any more)."""
    sh("ip", "netns", "del", link.ns, check=False)
    sh("ip", "link", "del", link.host_if, check=False)


def shape(
    dev: str,
    *,
    mbps: float,
    delay_ms: float = 0.0,
    ns: str | None = None,
    burst: str = "16kb",
    latency: str = "2s",
) -> bool:
    """Shape what ``dev`` sends (its egress) to ``mbps`` with ``tc tbf``, behind ``delay_ms`` of netem delay.

    Returns whether the delay applies: False when ``delay_ms`` was asked for but the kernel has no
    ``sch_netem`` (some cloud and container kernels); the rate limit applies either way.
    """
    tc = in_netns(ns, "tc")
    tbf = ["tbf", "rate", f"{mbps:g}mbit", "burst", burst, "latency", latency]
    if delay_ms > 0:
        # netem's classic layout: netem at the root delays, a tbf child limits the rate.
        netem = ["netem", "delay", f"{delay_ms:g}ms"]
        if sh(*tc, "qdisc", "add", "dev", dev, "root", "handle", "1:", *netem, check=False).returncode == 0:
            sh(*tc, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", *tbf)
            return True
    sh(*tc, "qdisc", "add", "dev", dev, "root", *tbf)
    return delay_ms <= 0
