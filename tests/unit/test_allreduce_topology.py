"""The fault-tolerant tree's topology (papers/001 Fig. 7) for every tree size up to 31, and the ring."""

from __future__ import annotations

import pytest

from edgeagent.allreduce import topology as T
from edgeagent.errors import ConfigError

SIZES = range(1, 32)


def test_fig7_node_3() -> None:
    n = T.node(3, 7)
    assert (n.parent, n.children, n.brother, n.uncle) == (1, (), 4, 2)
    assert T.node(0, 7) == T.Node(0, None, (1, 2), None, None)
    assert T.node(1, 7) == T.Node(1, 0, (3, 4), 2, None)
    assert T.node(6, 7) == T.Node(6, 2, (), 5, 1)


@pytest.mark.parametrize("size", SIZES)
def test_parent_child_symmetry(size: int) -> None:
    for r in range(size):
        for c in T.children(r, size):
            assert T.parent(c, size) == r
        p = T.parent(r, size)
        assert (p is None) == (r == 0)
        if p is not None:
            assert r in T.children(p, size)
    # every non-root node has exactly one parent: a spanning tree
    assert sorted(c for r in range(size) for c in T.children(r, size)) == list(range(1, size))
    assert T.height(size) == max(T.depth(r) for r in range(size))


@pytest.mark.parametrize("size", SIZES)
def test_brother_and_uncle(size: int) -> None:
    for r in range(size):
        b = T.brother(r, size)
        if b is not None:
            assert b != r
            assert T.brother(b, size) == r
            assert T.parent(b, size) == T.parent(r, size)
        else:
            # root, or an only child: the last rank of an even size
            assert r == 0 or (r == size - 1 and r % 2 == 1)
        u = T.uncle(r, size)
        p = T.parent(r, size)
        assert u == (None if p is None else T.brother(p, size))
        if u is not None:
            assert T.depth(u) == T.depth(r) - 1
            assert r not in T.children(u, size)


@pytest.mark.parametrize("size", SIZES)
def test_backup_links_per_node(size: int) -> None:
    for r in range(size):
        for w in T.watchers(r, size):
            assert r in T.watched(w, size)
        for w in T.watched(r, size):
            assert r in T.watchers(w, size)
        # at most 2 backups of its own, and watched by at most brother + 2 nephews
        assert len(T.watchers(r, size)) <= 2
        assert len(T.watched(r, size)) <= 3
    links = T.backup_links(size)
    assert len(links) == len({frozenset(x) for x in links})
    assert {frozenset(x) for x in links}.isdisjoint({frozenset(x) for x in T.main_links(size)})
    if size >= 7 and (size + 1) & size == 0:  # complete trees: every node below level 1 has 2 backups
        assert all(len(T.watchers(r, size)) == 2 for r in range(3, size))


def test_complete_tree_link_counts() -> None:
    # a complete tree of height h: n-1 main links, (n-1)/2 brother pairs, n-3 uncle links
    for h in range(2, 6):
        n = 2 ** (h + 1) - 1
        assert len(T.main_links(n)) == n - 1
        assert len(T.backup_links(n)) == (n - 1) // 2 + (n - 3)


def test_ring_and_rebuild() -> None:
    assert [T.ring_next(r, 4) for r in range(4)] == [1, 2, 3, 0]
    assert [T.ring_prev(r, 4) for r in range(4)] == [3, 0, 1, 2]
    assert T.ring_next(0, 1) == 0
    assert T.rebuild(["a", "b", "c", "d"], {"b"}) == {"a": 0, "c": 1, "d": 2}
    with pytest.raises(ConfigError, match="no live member"):
        T.rebuild(["a"], {"a"})
    with pytest.raises(ConfigError, match=r"outside 0\.\.6"):
        T.parent(7, 7)
    with pytest.raises(ConfigError, match="size=0"):
        T.children(0, 0)
