"""Tests for edgeagent.zoo: PiPar's VGG-5 and MobileNetV3-Small (papers/003 Table 2) as layer lists."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edgeagent.models import ModelSpec, build_layers, build_model, layer_output_shapes, num_layers
from edgeagent.zoo import SqueezeExcitation, V3Block


@pytest.mark.parametrize("in_shape", [(1, 28, 28), (3, 32, 32)])
def test_vgg5_is_table_2(in_shape: tuple[int, int, int]) -> None:
    spec = ModelSpec("vgg5", in_shape, 10)
    assert num_layers(spec) == 5
    shapes = layer_output_shapes(spec, batch_size=2)
    side = 7 if in_shape[1] == 28 else 8
    assert shapes == [
        (2, 32, 2 * side, 2 * side),
        (2, 64, side, side),
        (2, 64, side, side),
        (2, 128),
        (2, 10),
    ]
    convs = [m for m in build_model(spec, seed=0).modules() if isinstance(m, nn.Conv2d)]
    assert [(c.kernel_size, c.out_channels) for c in convs] == [((3, 3), 32), ((3, 3), 64), ((3, 3), 64)]


@pytest.mark.parametrize("in_shape", [(1, 28, 28), (3, 32, 32)])
def test_mobilenetv3_small_is_table_2(in_shape: tuple[int, int, int]) -> None:
    spec = ModelSpec("mobilenetv3", in_shape, 7)
    assert num_layers(spec) == 15
    model = build_model(spec, seed=0)
    blocks = [m for m in model if isinstance(m, V3Block)]
    assert len(blocks) == 11
    out_channels = [[m for m in b.modules() if isinstance(m, nn.Conv2d)][-1].out_channels for b in blocks]
    assert out_channels == [16, 24, 24, 40, 40, 40, 48, 48, 96, 96, 96]
    assert sum(isinstance(m, SqueezeExcitation) for m in model.modules()) == 9
    shapes = layer_output_shapes(spec, batch_size=2)
    assert shapes[0] == (2, 16, in_shape[1], in_shape[2])  # stride-1 stem below 64x64
    assert shapes[12] == (2, 576, 2, 2)
    assert shapes[13:] == [(2, 1024), (2, 7)]
    model.train()
    assert model(torch.randn(4, *in_shape)).shape == (4, 7)


def test_mobilenetv3_stride_2_stem_on_large_inputs() -> None:
    assert layer_output_shapes(ModelSpec("mobilenetv3", (3, 64, 64), 10))[0] == (1, 16, 32, 32)
    forced = ModelSpec("mobilenetv3", (3, 32, 32), 10, (("stem_stride", 2),))
    assert layer_output_shapes(forced)[0] == (1, 16, 16, 16)


@pytest.mark.parametrize("name", ["vgg5", "mobilenetv3"])
def test_layers_are_deterministic_per_seed(name: str) -> None:
    spec = ModelSpec(name, (1, 28, 28), 10)
    a, b = build_model(spec, seed=4), build_model(spec, seed=4)
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key]), key
    other = build_model(spec, seed=5)
    assert not torch.equal(a.state_dict()["0.0.weight"], other.state_dict()["0.0.weight"])
    # A device that builds only its layers gets the same weights as the whole model's.
    (second,) = build_layers(spec, 1, 2, seed=4)
    for key, value in second.state_dict().items():
        assert torch.equal(value, a.state_dict()[f"1.{key}"]), key


def test_vgg5_without_batch_norm_and_bad_options() -> None:
    plain = build_model(ModelSpec("vgg5", (1, 28, 28), 10, (("batch_norm", False),)), seed=0)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in plain.modules())
    with pytest.raises(ValueError, match="hidden"):
        num_layers(ModelSpec("vgg5", (1, 28, 28), 10, (("hidden", 0),)))
    with pytest.raises(ValueError, match=r"\(C, H, W\)"):
        num_layers(ModelSpec("vgg5", (784,), 10))
    with pytest.raises(ValueError, match="stem_stride"):
        num_layers(ModelSpec("mobilenetv3", (1, 28, 28), 10, (("stem_stride", 3),)))
