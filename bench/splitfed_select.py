"""PiPar's automated (P, N) selection (papers/003 Sec. 3.3, Table 7) on the estimate: ours beside the paper's.

    python bench/splitfed_select.py [--batch 100] [--samples 60000] [--device-slowdown 30] [--json FILE]

VGG-5 on 28x28x1 (MNIST-sized) is profiled once on this machine (the server; forward and backward per
layer at batch B and B/8, ``splitfed.profile``); each device is ``--device-slowdown`` times slower
(default 30: an assumption for a Raspberry Pi 3B against one x86 core, not a measurement), and with
"hetero" device 0 is 2x slower again (the paper's Sec. 5.6.1: half the clock). For K = 2 and 4
devices (``--samples`` split evenly) and the issue's links (4G 10/25 Mbit/s up/down, 4G+ 20/40,
WiFi 50/50; ``--latency-ms`` per message) it prints the (P_k, N_k) chosen by ours and by the paper's
rule, the estimated epoch time (``cost.epoch_time``: contended server, floor(B/N) mini-batches, the
FedAvg exchange) of ours, the paper's, the best common (P, N), FL and SFL, the score T_opt / T (eq. 28)
against the exhaustive search of every common (P, N) in [1, 5] x [1, B] over the same estimate, and the
selection's own time against one epoch. Everything is the estimate: the measured exhaustive search,
which trains one iteration per (P, N), belongs to the split-federated mode's bench. Paper (Table 7,
VGG-5 MNIST): score >= 0.97, selection 1.3-1.7 s against 4.5-10.5 s epochs. The issue's goals: score
>= 0.96, selection < 30% of an epoch, per-device (P_k, N_k) that differ and beat the best common one
with one device 2x slower.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgeagent.models import ModelSpec
from edgeagent.splitfed.cost import Choice, DeviceCosts, LayerTimes, epoch_time
from edgeagent.splitfed.plan import baseline, exhaustive, select
from edgeagent.splitfed.profile import param_bytes, profile_layers

SPEC = ModelSpec("vgg5", (1, 28, 28), 10)
LINKS = {"4G": (10.0, 25.0), "4G+": (20.0, 40.0), "WiFi": (50.0, 50.0)}


def _scaled(times: LayerTimes, factor: float) -> LayerTimes:
    return LayerTimes(
        tuple(t * factor for t in times.fwd),
        tuple(t * factor for t in times.bwd),
        tuple(t * factor for t in times.fwd_fixed),
        tuple(t * factor for t in times.bwd_fixed),
    )


def _show(choices: dict[str, Choice]) -> str:
    return " ".join(f"{c.split}/{c.n}" for c in choices.values())


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    started = time.perf_counter()
    server, act, grad = profile_layers(SPEC, args.batch, iterations=args.iterations, fit_fixed=True)
    profiling = time.perf_counter() - started
    params = param_bytes(SPEC)
    device = _scaled(server, args.device_slowdown)
    step = sum(server.fwd) + sum(server.bwd)
    print(
        f"profiled VGG-5 28x28 at B={args.batch} in {profiling:.1f} s: one step {step * 1e3:.0f} ms on the "
        f"server, {step * args.device_slowdown * 1e3:.0f} ms on a device ({args.device_slowdown:g}x)"
    )
    print("P/N per device (device 0 first); est. epoch seconds; score = T_exhaustive / T")
    header = (
        f"{'case':<18} {'ours P/N':<20} {'paper P/N':<20} {'ours':>7} {'paper':>7} {'common':>7} "
        f"{'FL':>7} {'SFL':>7} {'SFL/ours':>8} {'FL/ours':>8} {'score':>6} {'paper':>6} "
        f"{'sel s':>6} {'sel/ep':>6}"
    )
    print(header)
    rows: list[dict[str, Any]] = []
    for k in (2, 4):
        for hetero in (False, True):
            for link, (up, down) in LINKS.items():
                devices = [
                    DeviceCosts(
                        f"d{i}",
                        _scaled(device, 2.0) if hetero and i == 0 else device,
                        up * 1e6 / 8,
                        down * 1e6 / 8,
                        args.samples // k,
                        latency_s=args.latency_ms / 1000,
                    )
                    for i in range(k)
                ]
                t0 = time.perf_counter()
                ours = select(devices, server, act, grad, args.batch, param_bytes=params)
                selection = time.perf_counter() - t0
                paper = select(devices, server, act, grad, args.batch, method="paper")
                common = select(devices, server, act, grad, args.batch, per_device=False, param_bytes=params)
                best = exhaustive(devices, server, act, grad, args.batch, param_bytes=params)
                fl = baseline("fl", devices, server, act, grad, args.batch, param_bytes=params)
                sfl = baseline("sfl", devices, server, act, grad, args.batch, param_bytes=params)

                def est(choices: dict[str, Choice], devices: list[DeviceCosts] = devices) -> float:
                    return epoch_time(devices, server, act, grad, args.batch, choices, param_bytes=params)

                t = {name: est(c) for name, c in (("ours", ours), ("paper", paper), ("common", common))}
                t |= {"exhaustive": est(best), "fl": est(fl), "sfl": est(sfl)}
                case = f"K={k} {'hetero' if hetero else 'homog.'} {link}"
                row = {
                    "case": case,
                    "ours": {n: [c.split, c.n] for n, c in ours.items()},
                    "paper": {n: [c.split, c.n] for n, c in paper.items()},
                    "epoch_s": t,
                    "score_ours": t["exhaustive"] / t["ours"],
                    "score_paper": t["exhaustive"] / t["paper"],
                    "selection_s": selection,
                }
                rows.append(row)
                print(
                    f"{case:<18} {_show(ours):<20} {_show(paper):<20} {t['ours']:7.2f} {t['paper']:7.2f} "
                    f"{t['common']:7.2f} {t['fl']:7.2f} {t['sfl']:7.2f} {t['sfl'] / t['ours']:8.2f} "
                    f"{t['fl'] / t['ours']:8.2f} {row['score_ours']:6.3f} {row['score_paper']:6.3f} "
                    f"{selection:6.2f} {selection / t['ours']:6.1%}"
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=100, help="B, the batch size of FL (paper: 100)")
    parser.add_argument("--samples", type=int, default=60000, help="training samples over all devices")
    parser.add_argument(
        "--device-slowdown", type=float, default=30.0, help="device time / server time (assumed Pi 3B: 30)"
    )
    parser.add_argument("--latency-ms", type=float, default=5.0, help="per message, each way")
    parser.add_argument("--iterations", type=int, default=5, help="profiling iterations (medians)")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    rows = run(args)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
