"""AccEPT compression: Table 3, codec speed, and training on slow links with and without it.

    python bench/compression.py [--epochs 10] [--batches 120] [--json FILE]

1. Table 3 (papers/004): MobileNetV2 (width 1.0, 3x32x32 input) at batch 128, its largest and smallest
   activation that can cross a link: size and ratio for 2/3/4-bit forward compression with the
   encoder (bases packed eight to a byte) and without it (one byte per base), and 4-bit backward.
2. Compress + decompress MB/s on one core, and the codec time against the transmission time it saves
   on a 50 Mbit/s link (target: under 10%).
3. Training with 3 devices (digits, MLP) at 0.5, 1 and 4 Mbit/s uplinks: samples/s without compression
   and with 2-bit activations / 8-bit gradients, the speed-up (target at 0.5 Mbit/s: >= 2.5x), and the
   final accuracy of full runs without compression and with the adaptive schedule (target: within 1
   point).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from edgeagent.compression import get_codec
from edgeagent.config import CentralConfig, TrainConfig
from edgeagent.demo import run_demo
from edgeagent.logs import setup_logging
from edgeagent.models import ModelSpec, build_model

KB = 1024


def activations() -> dict[str, torch.Tensor]:
    """The largest and smallest output of MobileNetV2's layers that a cut can send (not the logits)."""
    spec = ModelSpec("mobilenetv2", (3, 32, 32), 10, (("width_mult", 1.0),))
    model = build_model(spec, seed=0).eval()
    x = torch.randn(128, 3, 32, 32)  # (B, C, H, W)
    outs = []
    with torch.no_grad():
        for layer in list(model)[:-1]:
            x = layer(x)
            outs.append(torch.relu(x) if x.dim() == 4 else x)  # the real inputs of the next layer
    sizes = [o.numel() for o in outs]
    return {"largest": outs[sizes.index(max(sizes))], "smallest": outs[sizes.index(min(sizes))]}


def table3(tensors: dict[str, torch.Tensor]) -> dict[str, dict[str, float]]:
    rows: dict[str, dict[str, float]] = {}
    for name, t in tensors.items():
        raw = t.numel() * 4
        rows.setdefault("original", {})[name] = raw
        for k in (2, 3, 4):
            c = get_codec(f"mbq{k}").compress(t)
            rows.setdefault(f"{k}-bit comp.", {})[name] = c.nbytes()
            # Without the encoder every base is a byte of its own (Sec. 3.3, Table 3 "w/o enc.").
            rows.setdefault(f"{k}-bit w/o enc.", {})[name] = c.nbytes() - len(c.data) + k * t.numel()
        g = get_codec("sq4").compress(t, generator=torch.Generator().manual_seed(0))
        rows.setdefault("4-bit backward", {})[name] = g.nbytes()
    return rows


def codec_speed(t: torch.Tensor, repeats: int = 5) -> dict[str, float]:
    torch.set_num_threads(1)
    out = {}
    for wire_id in ("mbq2", "mbq3", "mbq4", "sq8", "sq4"):
        codec = get_codec(wire_id)
        gen = torch.Generator().manual_seed(0)
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            codec.decompress(
                codec.compress(t, generator=gen) if wire_id.startswith("sq") else codec.compress(t)
            )
            best = min(best, time.perf_counter() - started)
        out[wire_id] = best
    torch.set_num_threads(2)
    return out


def train(link: float, compression: str, *, epochs: int, batches: int | None) -> Any:
    config = CentralConfig(
        train=TrainConfig(epochs=epochs, max_batches=batches), progress=False, compression=compression
    )
    return run_demo(config, workers=2, slowdowns=[], broker=None, show_progress=False, links=[link])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=10, help="epochs of the accuracy runs")
    parser.add_argument("--batches", type=int, default=120, help="batches of the speed runs")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    setup_logging("WARNING")
    results: dict[str, Any] = {}

    tensors = activations()
    rows = table3(tensors)
    results["table3"] = rows
    shapes = {n: tuple(t.shape) for n, t in tensors.items()}
    print(
        f"Table 3: MobileNetV2 activations at batch 128 (largest {shapes['largest']}, "
        f"smallest {shapes['smallest']})"
    )
    print(f"{'':<18}{'largest KB':>12}{'CR':>8}{'smallest KB':>13}{'CR':>8}")
    for row, v in rows.items():
        cells = "".join(
            f"{v[n] / KB:>12.2f}{rows['original'][n] / v[n]:>8.2f}"
            if n == "largest"
            else f"{v[n] / KB:>13.2f}{rows['original'][n] / v[n]:>8.2f}"
            for n in ("largest", "smallest")
        )
        print(f"{row:<18}{cells}")
    print(
        f"target: 2-bit ratio on the largest >= 15 (paper 15.93): "
        f"{rows['original']['largest'] / rows['2-bit comp.']['largest']:.2f}"
    )

    speed = codec_speed(tensors["largest"])
    raw = rows["original"]["largest"]
    mb = raw / 1e6
    link = 50e6 / 8  # bytes/s
    print(f"\ncodec speed on one core, {raw / KB / KB:.1f} MiB activation (compress + decompress):")
    results["speed"] = {}
    for wire_id, seconds in speed.items():
        row = f"{wire_id[:3]}{wire_id[3:]}-bit" if wire_id.startswith("mbq") else wire_id
        key = f"{wire_id[3:]}-bit comp." if wire_id.startswith("mbq") else "4-bit backward"
        saved = (raw - rows[key]["largest"]) / link if key in rows else (raw - raw / 4) / link
        results["speed"][wire_id] = {"seconds": seconds, "saved_at_50mbps": saved}
        print(
            f"  {wire_id:<5} {mb / seconds:>8.1f} MB/s  {1e3 * seconds:>7.1f} ms = "
            f"{100 * seconds / saved:>5.1f}% of the {1e3 * saved:.0f} ms it saves at 50 Mbit/s"
        )
    print("target: codec time under 10% of the transmission time it saves at 50 Mbit/s")

    print(f"\ntraining, digits MLP, 3 devices, {args.batches} batches per speed run:")
    print(f"{'uplink':>10}{'none samples/s':>16}{'2-bit samples/s':>17}{'speed-up':>10}")
    results["training"] = {}
    for mbps in (0.5, 1.0, 4.0):
        plain = train(mbps, "none", epochs=args.epochs, batches=args.batches)
        packed = train(mbps, "2", epochs=args.epochs, batches=args.batches)
        up = packed.samples_per_second / plain.samples_per_second
        results["training"][str(mbps)] = {
            "none": plain.samples_per_second,
            "2": packed.samples_per_second,
            "speedup": up,
        }
        print(f"{mbps:>7} Mb/s{plain.samples_per_second:>16.1f}{packed.samples_per_second:>17.1f}{up:>9.2f}x")
    print("target: >= 2.5x at 0.5 Mbit/s")

    plain = train(4.0, "none", epochs=args.epochs, batches=None)
    adaptive = train(4.0, "adaptive", epochs=args.epochs, batches=None)
    two = train(4.0, "2", epochs=args.epochs, batches=None)
    results["accuracy"] = {
        "none": plain.final_accuracy,
        "adaptive": adaptive.final_accuracy,
        "2": two.final_accuracy,
    }
    print(
        f"\nfinal accuracy after {args.epochs} epochs at 4 Mbit/s: none {plain.final_accuracy:.1%}, "
        f"adaptive (2->3->4 bit) {adaptive.final_accuracy:.1%}, 2-bit {two.final_accuracy:.1%}"
    )
    print(
        f"target: within 1 point of uncompressed: adaptive "
        f"{100 * (adaptive.final_accuracy - plain.final_accuracy):+.1f} points, 2-bit "
        f"{100 * (two.final_accuracy - plain.final_accuracy):+.1f} points"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
