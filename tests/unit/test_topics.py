"""Topics (``protocol/topics.py``): builders, parsing, filters, wildcards and names."""

from __future__ import annotations

import pytest

from edgeagent.errors import ProtocolError
from edgeagent.protocol.topics import (
    ANY,
    DiscoveryInfo,
    DiscoveryTopics,
    Family,
    TopicFilters,
    TopicInfo,
    Topics,
    check_discovery_prefix,
    check_name,
    cluster_level,
    fill_wildcards,
    filter_wildcards,
    parse_topic,
    topic_matches,
)

T = Topics("clu-1")


def _link(family: Family) -> str:
    if family is not Family.LINK:
        raise ValueError(f"{family} is not a link")
    return T.link("w1", "w2")


def _builders(family: Family) -> list[str]:
    """Which of fixed / device / stage accept ``family`` (exactly one should)."""
    out = []
    for name, build_one in (
        ("fixed", lambda: T.fixed(family)),
        ("device", lambda: T.device(family, "w1")),
        ("stage", lambda: T.stage(family, 0, "w1")),
        ("link", lambda: _link(family)),
    ):
        try:
            build_one()
        except ValueError:
            continue
        out.append(name)
    return out


def _all_built_topics() -> list[tuple[str, TopicInfo]]:
    out: list[tuple[str, TopicInfo]] = []
    for family in Family:
        kinds = _builders(family)
        if kinds == ["fixed"]:
            out.append((T.fixed(family), TopicInfo(family)))
        elif kinds == ["device"]:
            for dev in ("w1", "Central_0.a-b", "x" * 64):
                out.append((T.device(family, dev), TopicInfo(family, device=dev)))
        elif kinds == ["stage"]:
            for stage, dev in ((0, "central"), (1, "w1"), (12, "x" * 64)):
                out.append((T.stage(family, stage, dev), TopicInfo(family, device=dev, stage=stage)))
        elif kinds == ["link"]:
            for a, b in (("w1", "w2"), ("central", "x" * 64)):
                out.append((T.link(a, b), TopicInfo(family, device=a, peer=b)))
    for stage in (0, 3):
        out.append((T.activations(stage, "w1"), TopicInfo(Family.ACTIVATIONS, device="w1", stage=stage)))
        out.append((T.gradients(stage, "w1"), TopicInfo(Family.GRADIENTS, device="w1", stage=stage)))
        out.append((T.results(stage, "w1"), TopicInfo(Family.RESULTS, device="w1", stage=stage)))
    return out


@pytest.mark.parametrize("family", list(Family), ids=lambda f: f.name)
def test_every_family_has_exactly_one_builder(family: Family) -> None:
    assert len(_builders(family)) == 1, _builders(family)


def test_topic_builders_cover_every_family() -> None:
    assert {info.family for _, info in _all_built_topics()} == set(Family)


@pytest.mark.parametrize(("topic", "info"), _all_built_topics(), ids=lambda v: str(v))
def test_topic_parse_inverts_builders(topic: str, info: TopicInfo) -> None:
    assert topic.startswith("edgeagent/v1/clu-1/")
    assert T.parse(topic) == info
    assert topic_matches(T.all(), topic)
    assert not any(ch in topic for ch in "+#")
    assert not topic_matches(Topics("other").all(), topic)


def test_topic_device_wildcards() -> None:
    pattern = T.devices(Family.HEARTBEAT)
    assert topic_matches(pattern, T.device(Family.HEARTBEAT, "w1"))
    assert topic_matches(pattern, T.device(Family.HEARTBEAT, "w2"))
    assert not topic_matches(pattern, T.device(Family.STATUS, "w1"))
    assert not topic_matches(pattern, T.activations(0, "w1"))
    stage_inputs = T.stage_filter(Family.ACTIVATIONS, 1)  # every producer of stage 1's activations
    assert topic_matches(stage_inputs, T.activations(1, "w1")) and topic_matches(
        stage_inputs, T.activations(1, "w2")
    )
    assert not topic_matches(stage_inputs, T.activations(2, "w1"))
    assert not topic_matches(stage_inputs, T.gradients(1, "w1"))


@pytest.mark.parametrize(("topic", "info"), _all_built_topics(), ids=lambda v: str(v))
def test_parse_topic_of_any_cluster(topic: str, info: TopicInfo) -> None:
    assert cluster_level(topic) == "clu-1"
    assert parse_topic(topic) == ("clu-1", info)
    assert parse_topic(topic.replace("/clu-1/", "/other/", 1)) == ("other", info)


@pytest.mark.parametrize(
    "topic", ["edgeagent/v1/clu-1", "edgeagent/v2/clu-1/run/commit", "x/v1/clu-1/run/commit", "", "edgeagent"]
)
def test_cluster_level_needs_the_root_and_a_level_after_the_cluster(topic: str) -> None:
    assert cluster_level(topic) is None
    with pytest.raises(ProtocolError, match="not under edgeagent/v1/<cluster>/"):
        parse_topic(topic)


def test_cluster_level_of_filters_and_bad_names() -> None:
    assert cluster_level("edgeagent/v1/+/device/+/status") == "+"
    assert cluster_level("edgeagent/v1/#/x") == "#"
    assert cluster_level("edgeagent/v1/clu-1/") == "clu-1"
    for bad in ("edgeagent/v1/+/run/commit", "edgeagent/v1/a b/run/commit", "edgeagent/v1/clu-1/run/nope"):
        with pytest.raises(ProtocolError):
            parse_topic(bad)


@pytest.mark.parametrize("cluster", ["clu-1", ANY])
def test_topic_filters_match_the_topics_they_name(cluster: str) -> None:
    tree = TopicFilters(cluster)
    assert TopicFilters() == TopicFilters(ANY)
    for other in (T, Topics("other")):
        matches = other.cluster == "clu-1" or cluster == ANY
        for topic, info in _all_built_topics():
            topic = topic.replace("/clu-1/", f"/{other.cluster}/", 1)
            assert topic_matches(tree.all(), topic) is matches
            if info.family is Family.LINK:
                assert info.device is not None and info.peer is not None
                assert topic_matches(tree.link(), topic) is matches
                assert topic_matches(tree.link(info.device, info.peer), topic) is matches
                assert not topic_matches(tree.link(info.peer, "someone-else"), topic)
            elif info.stage is not None:
                assert info.device is not None  # a stage output names the device that computed it
                assert topic_matches(tree.stage(info.family), topic) is matches
                assert topic_matches(tree.stage(info.family, info.device), topic) is matches
                assert not topic_matches(tree.stage(info.family, "someone-else"), topic)
            elif info.device is not None:
                assert topic_matches(tree.device(info.family), topic) is matches
                assert topic_matches(tree.device(info.family, info.device), topic) is matches
                assert not topic_matches(tree.device(info.family, "someone-else"), topic)
            else:
                assert topic_matches(tree.fixed(info.family), topic) is matches
    assert TopicFilters("clu-1").all() == T.all()
    assert TopicFilters("clu-1").device(Family.HEARTBEAT) == T.devices(Family.HEARTBEAT)
    with pytest.raises(ValueError):
        tree.device(Family.ACTIVATIONS)
    with pytest.raises(ValueError):
        tree.stage(Family.STATUS)
    with pytest.raises(ValueError):
        tree.fixed(Family.STATUS)


def test_filter_wildcards_and_filling_them() -> None:
    assert filter_wildcards("a/b") == (0, False)
    assert filter_wildcards("a/+/b/+") == (2, False)
    assert filter_wildcards("+/#") == (1, True)
    assert filter_wildcards("a/b#") == (0, False)  # not a wildcard level
    assert fill_wildcards("a/+/b/+", ["x", "y"]) == "a/x/b/y"
    assert fill_wildcards("a/b", []) == "a/b"
    with pytest.raises(ValueError):
        fill_wildcards("a/+/b/+", ["x"])


def test_discovery_topics() -> None:
    ha = DiscoveryTopics()
    assert ha.prefix == "homeassistant"
    assert ha.config("sensor", "node", "obj") == "homeassistant/sensor/node/obj/config"
    assert ha.configs("node") == "homeassistant/+/node/+/config"
    assert ha.configs() == "homeassistant/+/+/+/config"
    assert (ha.status(), ha.all()) == ("homeassistant/status", "homeassistant/#")
    assert ha.parse(ha.config("sensor", "node", "obj")) == DiscoveryInfo("config", node="node")
    assert ha.parse("homeassistant/status") == DiscoveryInfo("status")
    for other in ("homeassistant/#", ha.configs("node"), "homeassistant/status/x", "homeassistant/a/b/c/d"):
        assert ha.parse(other) == DiscoveryInfo("other")
    for outside in ("homeassistant", "homeassistantx/status", "edgeagent/v1/lab/run/commit", ""):
        assert ha.parse(outside) is None
    site = DiscoveryTopics("site/ha")
    assert site.parse("site/ha/sensor/n/o/config") == DiscoveryInfo("config", node="n")
    assert site.parse("homeassistant/sensor/n/o/config") is None


def test_check_discovery_prefix() -> None:
    assert check_discovery_prefix("site/ha") == "site/ha"
    for bad in ("", "#", "ha/+", "ha//x", "a/b/c/d/e", "edgeagent/x"):
        with pytest.raises(ValueError, match="discovery prefix"):
            check_discovery_prefix(bad)


@pytest.mark.parametrize("bad", ["a/b", "+", "#", "", "x" * 65, "a b", "w+1", "dev#", "ü", "a\tb"])
def test_invalid_device_ids_rejected(bad: str) -> None:
    with pytest.raises(ProtocolError, match="device id"):
        T.device(Family.STATUS, bad)
    with pytest.raises(ProtocolError):
        check_name("device id", bad)
    with pytest.raises(ProtocolError):
        Topics(bad)


def test_topic_builder_misuse() -> None:
    with pytest.raises(ValueError):
        T.device(Family.ACTIVATIONS, "w1")
    with pytest.raises(ValueError):
        T.stage(Family.STATUS, 0, "w1")
    with pytest.raises(ValueError):
        T.stage(Family.ACTIVATIONS, -1, "w1")
    with pytest.raises(ProtocolError):
        T.stage(Family.ACTIVATIONS, 0, "+")  # a wildcard is a filter (stage_filter), not a device
    with pytest.raises(ValueError):
        T.fixed(Family.ANNOUNCE)  # a device's own topic: device/<id>/announce
    with pytest.raises(ValueError):
        T.fixed(Family.STATUS)


@pytest.mark.parametrize(
    "topic",
    [
        "edgeagent/v1/other/run/commit",
        "edgeagent/v2/clu-1/run/commit",
        "edgeagent/v1/clu-1",
        "edgeagent/v1/clu-1/",
        "edgeagent/v1/clu-10/run/commit",
        "other/v1/clu-1/run/commit",
        "edgeagent/v1/clu-1/run",
        "edgeagent/v1/clu-1/run/commit/extra",
        "edgeagent/v1/clu-1/device/w1/teleport",
        "edgeagent/v1/clu-1/device/w1",
        "edgeagent/v1/clu-1/device/a/b/status",
        "edgeagent/v1/clu-1/device/+/status",
        "edgeagent/v1/clu-1/device//status",
        "edgeagent/v1/clu-1/stage/x/act",
        "edgeagent/v1/clu-1/stage/-1/act",
        "edgeagent/v1/clu-1/stage//act",
        "edgeagent/v1/clu-1/stage/1/status",
        "edgeagent/v1/clu-1/device/w1/act",
        "edgeagent/v1/clu-1/status",
        "edgeagent/v1/clu-1/#",
        "",
    ],
)
def test_topic_parse_rejects_foreign_topics(topic: str) -> None:
    with pytest.raises(ProtocolError):
        T.parse(topic)


@pytest.mark.parametrize(
    "topic",
    [
        pytest.param(
            "edgeagent/v1/clu-1/stage/\u00b2/act",
            id="superscript-stage",
        ),
        pytest.param(
            "edgeagent/v1/clu-1/stage/\u0663/act",
            id="arabic-indic-stage",
        ),
        pytest.param(
            "edgeagent/v1/clu-1/device/w1\n/status",
            id="device-id-trailing-newline",
        ),
    ],
)
def test_topic_parse_rejects_odd_topics(topic: str) -> None:
    with pytest.raises(ProtocolError):
        T.parse(topic)


@pytest.mark.parametrize(
    ("pattern", "topic", "expected"),
    [
        ("a/b/c", "a/b/c", True),
        ("a/b/c", "a/b", False),
        ("a/b", "a/b/c", False),
        ("a/+/c", "a/b/c", True),
        ("a/+/c", "a/b/d", False),
        ("a/+/c", "a/b/x/c", False),
        ("a/+", "a/b", True),
        ("a/+", "a/b/c", False),
        ("a/+", "a", False),
        ("a/+", "a/", True),  # + matches an empty level
        ("+/+", "/x", True),
        ("+", "a", True),
        ("+", "a/b", False),
        ("a/#", "a", True),  # MQTT-4.7.1-2: "sport/#" matches "sport" too
        ("a/#", "a/b", True),
        ("a/#", "a/b/c/d", True),
        ("a/#", "b/a", False),
        ("a/#", "ab", False),
        ("#", "a/b/c", True),
        ("+/b/#", "x/b", True),
        ("+/b/#", "x/c/d", False),
        ("a/b", "a/+", False),  # a literal '+' in a topic is not a wildcard match the other way round
    ],
)
def test_topic_matches(pattern: str, topic: str, expected: bool) -> None:
    assert topic_matches(pattern, topic) is expected
