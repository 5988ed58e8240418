"""The private Mosquitto's configuration: tuned (``set_tcp_nodelay``) or stock, loopback only."""

from __future__ import annotations

from edgeagent.broker.mosquitto import mosquitto_conf


def test_tuned_and_stock_differ_only_in_nodelay() -> None:
    tuned = mosquitto_conf(1884, nodelay=True).splitlines()
    stock = mosquitto_conf(1884, nodelay=False).splitlines()
    assert "listener 1884 127.0.0.1" in tuned
    assert "set_tcp_nodelay true" in tuned
    assert not any("nodelay" in line for line in stock)
    assert [line for line in tuned if line != "set_tcp_nodelay true"] == [line for line in stock if line]


def test_logins_and_extra_lines() -> None:
    conf = mosquitto_conf(1884, anonymous=False, extra="acl_file /tmp/acl\n")
    assert "allow_anonymous false" in conf.splitlines()
    assert conf.endswith("acl_file /tmp/acl\n")
