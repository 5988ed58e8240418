"""Weight redistribution after a re-partition (papers/000 Sec. III-D and III-F, Algorithm 1).

Two views of the same question, "which layers does a device need and where does it get them":

* :func:`algorithm1`, the paper's listing in stage indices, for a dynamic re-partition or one failure;
* :func:`redistribution_plan`, the same in device ids, for any old and new worker lists (a dynamic
  re-partition keeps the list; a recovery shrinks or reorders it). For a recovery, first map every
  failed stage to the device that holds its replica with :func:`recovery_sources`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from edgeagent.planner.partition import check_points, stage_of_layer


def algorithm1(
    p_new: Sequence[int],
    p_cur: Sequence[int],
    i_fail: int | None,
    i_cur: int,
    i_new: int,
    n: int,
) -> tuple[dict[int, list[int]], list[int]]:
    """Algorithm 1 (weight redistribution) exactly as listed; returns ``(M_need, L_local)``.

    ``M_need`` maps a stage index in the **new** worker list to the layers to fetch from it; ``L_local``
    lists the needed layers this worker already holds. Both are in ascending layer order.

    Index mapping (the paper counts the central node as stage 0 and calls the last stage ``N``, so its
    ``N`` is the number of workers excluding the central node). Here:

    * ``n`` is the number of stages **before** the failure, the central node included; stage indices are
      ``0..n-1``, stage 0 is the central node, and "the last stage" is ``n - 1`` (the paper's ``N``).
      ``len(p_cur) == n + 1``.
    * ``i_fail``: the failed stage (``1..n-1``: the central node does not fail), or ``None`` for a
      dynamic re-partition, where no index is corrected. After a failure ``p_new`` has ``n - 1`` stages
      and the worker list is renewed as in Sec. III-F: stages above ``i_fail`` move down by one, so
      ``i_new == i_cur - 1`` if ``i_cur > i_fail`` else ``i_cur``. Without a failure ``i_new == i_cur``
      and ``p_new`` has ``n`` stages. Inconsistent indices raise ``ValueError``.
    * Ranges are half-open: the paper's ``[start_new, end_new]`` is ``range(p_new[i_new], p_new[i_new+1])``.

    Lines 9-15: the owner ``I_target`` of a missing layer under ``p_cur`` is lowered by one if above
    ``i_fail``; if it *is* ``i_fail`` it stays, because the failed stage's chain replica lives on old
    stage ``i_fail + 1``, which is now ``i_fail``; if ``i_fail`` was the last stage (``n - 1``) the
    replica is on the central node and ``I_target = 0``.

    As in the listing, ``M_need`` may name the worker itself (old stage ``i_fail + 1`` needing the
    failed layers, or the central node needing the last stage's): the weights then come from the
    replica it holds, not from its current sub-model.
    """
    if n < 1 or len(p_cur) != n + 1:
        raise ValueError(f"n = {n} stages needs {n + 1} current points, got {list(p_cur)}")
    num_layers = p_cur[-1]
    check_points(p_cur, num_layers)
    check_points(p_new, num_layers)
    if not 0 <= i_cur < n:
        raise ValueError(f"current index {i_cur} is outside 0..{n - 1}")
    if i_fail is None:
        expected_stages, expected_new = n, i_cur
    else:
        if not 1 <= i_fail <= n - 1:
            raise ValueError(f"failed index {i_fail} is outside 1..{n - 1} (stage 0 is the central node)")
        if i_cur == i_fail:
            raise ValueError(f"stage {i_cur} failed; it has nothing to redistribute")
        expected_stages, expected_new = n - 1, i_cur - 1 if i_cur > i_fail else i_cur
    if len(p_new) - 1 != expected_stages:
        raise ValueError(
            f"new points {list(p_new)} give {len(p_new) - 1} stages; expected {expected_stages} "
            f"for n = {n} and failed index {i_fail}"
        )
    if i_new != expected_new:
        raise ValueError(
            f"new index {i_new} for current index {i_cur} with failed index {i_fail}; the renewed "
            f"worker list gives {expected_new}"
        )

    # Lines 1-3.
    start_cur, end_cur = p_cur[i_cur], p_cur[i_cur + 1]
    start_new, end_new = p_new[i_new], p_new[i_new + 1]
    needed = [layer for layer in range(start_new, end_new) if not start_cur <= layer < end_cur]
    # Lines 4-8.
    local = [layer for layer in range(start_new, end_new) if layer not in needed]
    # Lines 9-16.
    m_need: dict[int, list[int]] = {}
    for layer in needed:
        target = stage_of_layer(p_cur, layer)
        if i_fail is not None:
            if target > i_fail:
                target -= 1
            elif target == i_fail and i_fail == n - 1:
                target = 0
        m_need.setdefault(target, []).append(layer)
    return m_need, local


def recovery_sources(old_workers: Sequence[str], failed: Collection[str]) -> list[str]:
    """For every old stage, the device to fetch its weights from after ``failed`` devices are lost.

    An alive device serves its own stage. A failed stage ``i`` is served by its chain replica (Sec.
    III-E): the device of stage ``i + 1``, or the central node (stage 0) for the last stage. If that
    device failed too, the central node serves it from its global replica (Sec. III-F, multiple
    failures). The central node must not fail.
    """
    if not old_workers:
        raise ValueError("old worker list is empty (0 stages)")
    unknown = sorted(set(failed) - set(old_workers))
    if unknown:
        raise ValueError(f"failed devices {unknown} are not among the {len(old_workers)} old workers")
    if old_workers[0] in failed:
        raise ValueError(f"the central node {old_workers[0]!r} (stage 0 of {len(old_workers)}) cannot fail")
    sources = []
    for i, device in enumerate(old_workers):
        if device not in failed:
            sources.append(device)
            continue
        chain = old_workers[i + 1] if i + 1 < len(old_workers) else old_workers[0]
        sources.append(chain if chain not in failed else old_workers[0])
    return sources


@dataclass(frozen=True)
class DevicePlan:
    """What one device of the new pipeline holds, keeps and fetches."""

    device: str
    stage: int  # new stage index
    start: int  # new layer range [start, end)
    end: int
    local: tuple[int, ...]  # layers of the new range it already holds
    fetch: dict[str, tuple[int, ...]]  # source device -> layers to fetch from it (ascending)


def redistribution_plan(
    old_points: Sequence[int],
    new_points: Sequence[int],
    old_workers: Sequence[str],
    new_workers: Sequence[str],
    *,
    alive: Collection[str] | None = None,
) -> dict[str, DevicePlan]:
    """Per device of ``new_workers``: every layer of its new range comes from ``old_workers[i]``, where
    ``i`` owned the layer under ``old_points``; it is local when that is the device itself.

    ``old_workers[i]`` is the device that holds old stage ``i``'s weights *now*: the old worker list for
    a dynamic re-partition, or :func:`recovery_sources` of it after failures (a device may then appear
    twice). Every source must be in ``alive`` (default: ``new_workers``), else ``ValueError``: a failed
    device that was not mapped to its replica holder is caught here. Device lists may be reordered or
    shrink; ``new_workers`` must not repeat a device.
    """
    num_layers = old_points[-1] if old_points else 0
    check_points(old_points, num_layers)
    check_points(new_points, num_layers)
    if len(old_workers) != len(old_points) - 1:
        raise ValueError(f"{len(old_workers)} old workers for {len(old_points) - 1} old stages")
    if len(new_workers) != len(new_points) - 1:
        raise ValueError(f"{len(new_workers)} new workers for {len(new_points) - 1} new stages")
    if len(set(new_workers)) != len(new_workers):
        raise ValueError(f"new worker list {list(new_workers)} repeats a device ({len(new_workers)} entries)")
    serving = set(new_workers) if alive is None else set(alive)
    plans: dict[str, DevicePlan] = {}
    for stage, device in enumerate(new_workers):
        start, end = new_points[stage], new_points[stage + 1]
        local: list[int] = []
        fetch: dict[str, list[int]] = {}
        for layer in range(start, end):
            owner_stage = stage_of_layer(old_points, layer)
            source = old_workers[owner_stage]
            if source not in serving:
                raise ValueError(
                    f"layer {layer} (old stage {owner_stage}) would come from {source!r}, which is not "
                    f"alive among {len(serving)} devices; map failed stages with recovery_sources first"
                )
            if source == device:
                local.append(layer)
            else:
                fetch.setdefault(source, []).append(layer)
        plans[device] = DevicePlan(
            device=device,
            stage=stage,
            start=start,
            end=end,
            local=tuple(local),
            fetch={source: tuple(layers) for source, layers in fetch.items()},
        )
    return plans


def bytes_sent(
    plans: Mapping[str, DevicePlan], layer_bytes: Sequence[int], *, helpers: Mapping[str, int] | None = None
) -> dict[str, int]:
    """Bytes every source device sends in a switch (the data outstanding of its barrier): the weights and
    momentum (2 x the parameter bytes) of each layer a device fetches from it. ``helpers``: a replicated
    stage's primary (hybrid) -> its other devices, which fetch the primary's whole new stage: counted
    as sent by the primary (an upper bound, whoever serves them)."""
    sent: dict[str, int] = {}
    for plan in plans.values():
        for source, layers in plan.fetch.items():
            sent[source] = sent.get(source, 0) + 2 * sum(layer_bytes[j] for j in layers)
    for primary, count in (helpers or {}).items():
        own = plans.get(primary)
        if own is not None and count > 0:
            stage = 2 * sum(layer_bytes[j] for j in range(own.start, own.end))
            sent[primary] = sent.get(primary, 0) + count * stage
    return sent
