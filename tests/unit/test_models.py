"""Tests for edgeagent.models: layer lists, per-layer seeding and cutting at every point."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from torch import nn

from edgeagent.models import (
    MODEL_NAMES,
    InvertedResidual,
    ModelSpec,
    ResidualLinear,
    build_layers,
    build_model,
    layer_output_shapes,
    num_layers,
)

SHAPES: tuple[tuple[int, ...], ...] = ((1, 8, 8), (3, 32, 32))
THIS_MODULE = "tests.unit.test_models"


# Helpers that the tests load by dotted path, as a user would.
def tiny_model(in_shape: tuple[int, ...], num_classes: int, hidden: int = 16) -> nn.Sequential:
    """A user model taking the standard keyword arguments."""
    features = 1
    for d in in_shape:
        features *= d
    return nn.Sequential(nn.Flatten(), nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))


def tiny_model_no_args() -> nn.Sequential:
    """A user model that takes no arguments at all."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 10))


def not_sequential(in_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """A user model that is not cuttable."""
    return nn.Linear(1, num_classes)


def _assert_same_weights(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def _forward(layers: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        for layer in layers:
            layer.eval()
            x = layer(x)
    return x


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("in_shape", SHAPES)
def test_build_model_output_shape(name: str, in_shape: tuple[int, ...]) -> None:
    spec = ModelSpec(name, in_shape, 7)
    model = build_model(spec, seed=0)
    out = model(torch.randn(4, *in_shape))  # (B, K)
    assert out.shape == (4, 7)
    assert len(model) == num_layers(spec)


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("in_shape", SHAPES)
def test_every_cut_matches_whole_model(name: str, in_shape: tuple[int, ...]) -> None:
    spec = ModelSpec(name, in_shape, 10)
    total = num_layers(spec)
    whole = list(build_model(spec, seed=3))
    x = torch.randn(2, *in_shape)
    expected = _forward(whole, x)
    for k in range(1, total):
        parts = build_layers(spec, 0, k, seed=3) + build_layers(spec, k, total, seed=3)
        assert len(parts) == total
        for got, want in zip(parts, whole, strict=True):
            _assert_same_weights(got, want)
        assert torch.equal(_forward(parts, x), expected), f"cut at {k}"


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_single_layer_builds_match(name: str) -> None:
    spec = ModelSpec(name, (1, 8, 8), 10)
    whole = list(build_model(spec, seed=11))
    for j in range(num_layers(spec)):
        (layer,) = build_layers(spec, j, j + 1, seed=11)
        _assert_same_weights(layer, whole[j])


def test_seed_changes_weights() -> None:
    spec = ModelSpec("mlp", (64,), 10)
    a, b = build_model(spec, seed=0), build_model(spec, seed=1)
    assert not torch.equal(a.state_dict()["0.1.weight"], b.state_dict()["0.1.weight"])
    _assert_same_weights(a, build_model(spec, seed=0))


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("in_shape", SHAPES)
def test_layer_output_shapes(name: str, in_shape: tuple[int, ...]) -> None:
    spec = ModelSpec(name, in_shape, 10)
    shapes = layer_output_shapes(spec, batch_size=3)
    assert len(shapes) == num_layers(spec)
    assert shapes[-1] == (3, 10)
    assert all(s[0] == 3 for s in shapes)


def test_layer_counts() -> None:
    assert num_layers(ModelSpec("mlp", (64,), 10)) == 6  # central + 5 workers, one layer each
    assert num_layers(ModelSpec("mlp", (64,), 10, (("hidden", (128, 64)),))) == 3
    assert num_layers(ModelSpec("mlp", (64,), 10, (("hidden", (32, 32, 32)),))) == 4
    assert num_layers(ModelSpec("cnn", (1, 8, 8), 10)) == 8
    assert num_layers(ModelSpec("mobilenetv2", (3, 32, 32), 10)) == 21


def test_mlp_layers_of_equal_width_are_residual() -> None:
    layers = list(build_model(ModelSpec("mlp", (1, 8, 8), 10), seed=0))
    assert [type(m).__name__ for m in layers] == ["Sequential", *["ResidualLinear"] * 4, "Linear"]
    blocks = [m for m in layers if isinstance(m, ResidualLinear)]
    assert all(b.scale == pytest.approx(0.5) for b in blocks)  # 1/sqrt(4 residual layers)
    mixed = list(build_model(ModelSpec("mlp", (64,), 10, (("hidden", (64, 64, 32)),)), seed=0))
    assert isinstance(mixed[1], ResidualLinear) and mixed[1].scale == 1.0
    assert isinstance(mixed[2], nn.Sequential)  # 64 -> 32: Linear+ReLU
    plain = build_model(ModelSpec("mlp", (64,), 10, (("residual", False),)), seed=0)
    assert not any(isinstance(m, ResidualLinear) for m in plain)
    # The skip connection: with the branch's weights at zero the layer is the identity.
    block = blocks[0]
    with torch.no_grad():
        block.linear.weight.zero_()
        block.linear.bias.fill_(-1.0)
    x = torch.randn(3, 128)
    assert torch.equal(block(x), x)


def test_mobilenetv2_small_input_keeps_spatial_size() -> None:
    shapes = layer_output_shapes(ModelSpec("mobilenetv2", (1, 8, 8), 10))
    assert shapes[0][-2:] == (8, 8)  # stem stride 1 for small inputs
    assert shapes[-3][-2:] == (1, 1)
    big = layer_output_shapes(ModelSpec("mobilenetv2", (3, 64, 64), 10))
    assert big[0][-2:] == (32, 32)  # standard stride-2 stem
    forced = layer_output_shapes(ModelSpec("mobilenetv2", (3, 64, 64), 10, (("stem_stride", 1),)))
    assert forced[0][-2:] == (64, 64)
    blocks = [m for m in build_layers(ModelSpec("mobilenetv2", (1, 8, 8), 10), 1, 18, seed=0)]
    assert all(isinstance(b, InvertedResidual) for b in blocks)
    assert any(b.use_residual for b in blocks)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_global_rng_untouched(name: str) -> None:
    spec = ModelSpec(name, (1, 8, 8), 10)
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    build_layers(spec, 0, num_layers(spec), seed=5)
    layer_output_shapes(spec)
    assert torch.equal(torch.get_rng_state(), before)


def test_layers_do_not_depend_on_global_rng() -> None:
    spec = ModelSpec("cnn", (1, 8, 8), 10)
    torch.manual_seed(0)
    a = build_model(spec, seed=9)
    torch.manual_seed(1)
    b = build_model(spec, seed=9)
    _assert_same_weights(a, b)


@pytest.mark.parametrize("sep", [":", "."])
def test_dotted_path_model(sep: str) -> None:
    spec = ModelSpec(f"{THIS_MODULE}{sep}tiny_model", (1, 8, 8), 10, (("hidden", 12),))
    total = num_layers(spec)
    assert total == 4
    whole = build_model(spec, seed=2)
    assert whole(torch.randn(5, 1, 8, 8)).shape == (5, 10)
    assert whole[1].out_features == 12
    for k in range(1, total):
        parts = build_layers(spec, 0, k, seed=2) + build_layers(spec, k, total, seed=2)
        for got, want in zip(parts, whole, strict=True):
            _assert_same_weights(got, want)
    assert len(layer_output_shapes(spec)) == total


def test_dotted_path_no_args_fallback() -> None:
    spec = ModelSpec(f"{THIS_MODULE}:tiny_model_no_args", (1, 8, 8), 10)
    assert build_model(spec, seed=0)(torch.randn(2, 1, 8, 8)).shape == (2, 10)


def test_dotted_path_rng_untouched() -> None:
    before = torch.get_rng_state()
    build_layers(ModelSpec(f"{THIS_MODULE}:tiny_model", (64,), 10), 1, 3, seed=0)
    assert torch.equal(torch.get_rng_state(), before)


def test_dotted_path_not_sequential() -> None:
    with pytest.raises(ValueError, match="not_sequential"):
        build_model(ModelSpec(f"{THIS_MODULE}:not_sequential", (1, 8, 8), 10), seed=0)


@pytest.mark.parametrize(
    "name", [f"{THIS_MODULE}:does_not_exist", "no_such_pkg_xyz.mod:func", f"{THIS_MODULE}.THIS_MODULE"]
)
def test_dotted_path_bad(name: str) -> None:
    with pytest.raises(ValueError, match="model path"):
        build_model(ModelSpec(name, (1, 8, 8), 10), seed=0)


def test_unknown_name() -> None:
    with pytest.raises(ValueError, match="mobilenetv2") as info:
        build_model(ModelSpec("resnet", (1, 8, 8), 10), seed=0)
    assert "pkg.mod:func" in str(info.value)
    with pytest.raises(ValueError, match="mobilenetv2"):
        num_layers(ModelSpec("resnet", (1, 8, 8), 10))


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        (ModelSpec("mlp", (64,), 10, (("widht", 3),)), "widht"),
        (ModelSpec("mlp", (64,), 10, (("hidden", ()),)), "hidden"),
        (ModelSpec("mlp", (64,), 10, (("residual", "yes"),)), "residual"),
        (ModelSpec("cnn", (64,), 10), r"\(C, H, W\)"),
        (ModelSpec("mobilenetv2", (64,), 10), r"\(C, H, W\)"),
        (ModelSpec("mobilenetv2", (3, 32, 32), 10, (("stem_stride", 3),)), "stem_stride"),
    ],
)
def test_bad_options(spec: ModelSpec, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build_layers(spec, 0, 1, seed=0)


@pytest.mark.parametrize(("start", "end"), [(-1, 2), (2, 2), (3, 2), (0, 7)])
def test_bad_range(start: int, end: int) -> None:
    with pytest.raises(ValueError, match="0 <= start < end <= 6"):
        build_layers(ModelSpec("mlp", (64,), 10), start, end, seed=0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"name": "", "in_shape": (64,), "num_classes": 10},
        {"name": "mlp", "in_shape": (), "num_classes": 10},
        {"name": "mlp", "in_shape": (0, 8), "num_classes": 10},
        {"name": "mlp", "in_shape": (64,), "num_classes": 0},
        {"name": "mlp", "in_shape": (64,), "num_classes": 10, "options": (("a", 1), ("a", 2))},
    ],
)
def test_bad_spec(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        ModelSpec(**kwargs)


def test_spec_round_trip() -> None:
    spec = ModelSpec("mlp", (1, 8, 8), 10, (("hidden", (32, 16)),))
    d = json.loads(json.dumps(spec.to_dict()))
    assert d == {"name": "mlp", "in_shape": [1, 8, 8], "num_classes": 10, "options": {"hidden": [32, 16]}}
    back = ModelSpec.from_dict(d)
    assert back == spec
    assert hash(back) == hash(spec)
    assert back.opts() == {"hidden": (32, 16)}
    # A mapping and unsorted pairs normalise to the same spec.
    mapped = ModelSpec("mlp", (1, 8, 8), 10, {"hidden": [32, 16]})  # type: ignore[arg-type]
    assert mapped == spec
    with pytest.raises(ValueError, match="num_classes"):
        ModelSpec.from_dict({"name": "mlp", "in_shape": [64]})


def test_the_thesis_mlp_has_its_407050_parameters() -> None:
    """papers/001's network: 784-512-10, ``--model-option hidden=[512]`` on 28x28 digits."""
    model = build_model(ModelSpec("mlp", (1, 28, 28), 10, (("hidden", (512,)),)), seed=0)
    assert sum(p.numel() for p in model.parameters()) == 407_050
