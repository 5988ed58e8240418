"""Start-up of a device: a fresh process's first stage update, and the operator's commands.

A worker's first update used to pay two of torch's lazy imports (torch._dynamo on the first
``torch.optim`` call, sympy on the first ``tensor.backward(grad)``); edgeagent's
:class:`~edgeagent.pipeline.sgd.SGD` and :func:`~edgeagent.pipeline.backward.backward_with` do the same
arithmetic without them (bit for bit: tests/unit/test_sgd.py). Each figure is the median wall time of
``--runs`` fresh processes, from ``python`` starting to the first update done, run here side by side:

* "torch.optim + backward(grad)": the same middle stage (layers [2, 4) of the default MLP), updated the
  way edgeagent did before;
* "edgeagent SGD + backward_with": what a worker runs now.

And the operator's commands (``credentials``, ``certs``, ``profile``, ``broker``), which import no torch
now, against ``python -c "import torch"`` alone (what each of them cost at least before).

    .venv/bin/python bench/startup.py [--runs 5]

Shared machine: the ratio is the figure (a Pi is 10-50x slower in both columns).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

_STAGE = """
import sys
import torch
from edgeagent.models import ModelSpec, build_layers
from edgeagent.pipeline.stage import Stage, StageModule
from edgeagent.protocol.options import TrainOptions
layers = build_layers(ModelSpec("mlp", (1, 8, 8), 10), 2, 4, seed=0)
stage = Stage(StageModule({2 + k: layer for k, layer in enumerate(layers)}), TrainOptions(0.1, momentum=0.9),
              is_first=False, is_last=False)
if BASELINE:
    stage.optimizer = torch.optim.SGD(list(stage.module.parameters()), lr=0.1, momentum=0.9)
    import edgeagent.pipeline.stage as stage_module
    stage_module.backward_with = lambda out, grad: out.backward(grad)
out, _ = stage.forward(0, torch.randn(32, 128))
stage.backward(0, grad_output=torch.ones_like(out))
assert stage.version == 1
print(sorted(m for m in ("torch._dynamo", "sympy") if m in sys.modules))
"""


def _median_seconds(cmd: list[str], runs: int) -> tuple[float, str]:
    times, out = [], ""
    for _ in range(runs):
        started = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        times.append(time.perf_counter() - started)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd[:4])}... failed: {proc.stderr[-800:]}")
        out = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    return statistics.median(times), out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per figure (median)")
    args = parser.parse_args()
    py = sys.executable

    print(f"First stage update in a fresh process (median of {args.runs}):")
    before, before_mods = _median_seconds([py, "-c", _STAGE.replace("BASELINE", "True")], args.runs)
    after, after_mods = _median_seconds([py, "-c", _STAGE.replace("BASELINE", "False")], args.runs)
    print(f"  torch.optim + backward(grad)   {before:6.2f} s   imports {before_mods}")
    print(f"  edgeagent SGD + backward_with  {after:6.2f} s   imports {after_mods}")
    print(f"  ours / before: {after / before:.2f}x ({before - after:.2f} s less per device start here)")

    print(f"\nOperator commands (median of {args.runs}), against importing torch alone:")
    cli = [py, "-m", "edgeagent"]
    torch_cmd, _ = _median_seconds([py, "-c", "import torch"], args.runs)
    print(f"  python -c 'import torch'       {torch_cmd:6.2f} s")
    for command in ("credentials", "certs", "profile", "broker"):
        seconds, _ = _median_seconds([*cli, command, "--help"], args.runs)
        print(f"  edgeagent {command + ' --help':<20} {seconds:6.2f} s   {seconds / torch_cmd:.2f}x")


if __name__ == "__main__":
    main()
