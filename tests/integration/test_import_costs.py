"""What a module imports, seen from a fresh interpreter (an import already made in the test process would
hide it): a stage update needs neither torch._dynamo nor sympy; digits load without scikit-learn."""

from __future__ import annotations

import subprocess
import sys


def test_a_stage_update_imports_neither_torch_dynamo_nor_sympy() -> None:
    """The reason for both: torch.optim's first call imports torch._dynamo, tensor.backward(grad)'s
    imports sympy (seconds on a Pi, at every device's start)."""
    code = (
        "import sys, torch\n"
        "from edgeagent.models import ModelSpec, build_layers\n"
        "from edgeagent.pipeline.stage import Stage, StageModule, TrainOptions\n"
        "layers = build_layers(ModelSpec('mlp', (1, 8, 8), 10), 2, 4, seed=0)\n"
        "module = StageModule({2 + k: layer for k, layer in enumerate(layers)})\n"
        "stage = Stage(module, TrainOptions(0.1, momentum=0.9), is_first=False, is_last=False)\n"
        "out, _ = stage.forward(0, torch.randn(4, 128))\n"
        "stage.backward(0, grad_output=torch.ones_like(out))\n"
        "print(stage.version, sorted({'torch._dynamo', 'sympy'} & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "1 []", out.stdout + out.stderr


def test_digits_load_without_scikit_learn() -> None:
    """The loader reads the shipped file only: with scikit-learn made unimportable, digits still load."""
    code = (
        "import sys; sys.modules['sklearn'] = None\n"
        "from edgeagent.data import load_dataset\n"
        "ds = load_dataset('digits')\n"
        "print(len(ds.x_train) + len(ds.x_test), ds.num_classes)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1797", "10"]
