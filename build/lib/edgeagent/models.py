"""Models as ordered layer lists that a pipeline partition can cut between any two layers.

A model is described by a :class:`ModelSpec` (small, hashable, JSON/CBOR-safe through ``to_dict``) and is
never shipped as weights: every device rebuilds the layers it owns from the spec. Built-in models are
registered as functions returning one *factory* per layer, so :func:`build_layers` instantiates only the
requested range and a device never pays memory for layers that live on other devices.

Layer ``j`` is initialised under a seed derived from ``(seed, j)`` alone, so the same layer gets
bit-identical initial weights whichever device builds it and whatever range it is built in.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn

from edgeagent.zoo import mobilenet_init, mobilenetv3, vgg5

__all__ = [
    "MODEL_NAMES",
    "InvertedResidual",
    "LayerFactory",
    "ModelSpec",
    "ResidualLinear",
    "build_layers",
    "build_model",
    "layer_output_shapes",
    "num_layers",
]

LayerFactory = Callable[[], nn.Module]
"""Builds one layer of a model; called under a per-layer seed by :func:`build_layers`."""

MODEL_NAMES: tuple[str, ...] = ("mlp", "cnn", "mobilenetv2", "vgg5", "mobilenetv3")

_M = TypeVar("_M", bound=nn.Module)

_DOTTED_FORMS = "a dotted path 'pkg.mod:func' or 'pkg.mod.func' to a function returning an nn.Sequential"


# --------------------------------------------------------------------------------------------------------
# ModelSpec
# --------------------------------------------------------------------------------------------------------


def _freeze(value: Any) -> Any:
    """Turn lists (e.g. from JSON/CBOR) into tuples, recursively, so the spec stays hashable."""
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    """Turn tuples into lists, recursively, because JSON has no tuple and CBOR decodes arrays as lists."""
    if isinstance(value, list | tuple):
        return [_thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to rebuild a model on any device.

    ``name`` is one of :data:`MODEL_NAMES` or a dotted path ``"pkg.mod:func"`` / ``"pkg.mod.func"``.
    ``in_shape`` is the shape of one sample without the batch dimension, e.g. ``(1, 8, 8)`` or ``(64,)``.
    ``options`` are extra keyword arguments for the model function as sorted ``(key, value)`` pairs; a
    mapping is accepted too and normalised, and list values become tuples so the spec stays hashable.
    """

    name: str
    in_shape: tuple[int, ...]
    num_classes: int
    options: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(
                f"model name must be a non-empty string, got {self.name!r}; allowed: "
                f"{', '.join(MODEL_NAMES)} or {_DOTTED_FORMS}"
            )
        try:
            shape = tuple(int(d) for d in self.in_shape)
        except (TypeError, ValueError):
            raise ValueError(f"in_shape must be a sequence of positive ints, got {self.in_shape!r}") from None
        if not shape or any(d <= 0 for d in shape):
            raise ValueError(f"in_shape must be a non-empty sequence of positive ints, got {self.in_shape!r}")
        k = self.num_classes
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"num_classes must be an int >= 1, got {self.num_classes!r}")
        raw: Mapping[str, Any] | Iterable[Any] = self.options
        pairs = list(raw.items()) if isinstance(raw, Mapping) else list(raw)
        normalised: dict[str, Any] = {}
        for pair in pairs:
            if not isinstance(pair, list | tuple) or len(pair) != 2 or not isinstance(pair[0], str):
                raise ValueError(f"options must be (str, value) pairs or a mapping, got entry {pair!r}")
            key, value = pair
            if key in normalised:
                raise ValueError(f"option {key!r} given twice in options {self.options!r}")
            normalised[key] = _freeze(value)
        # Frozen dataclass, hence object.__setattr__; sorted so that equal specs compare (and hash) equal.
        object.__setattr__(self, "in_shape", shape)
        object.__setattr__(self, "options", tuple(sorted(normalised.items())))

    def opts(self) -> dict[str, Any]:
        """Options as a dict of keyword arguments."""
        return dict(self.options)

    def to_dict(self) -> dict[str, Any]:
        """A JSON/CBOR-safe dict (lists instead of tuples); inverse of :meth:`from_dict`."""
        return {
            "name": self.name,
            "in_shape": list(self.in_shape),
            "num_classes": self.num_classes,
            "options": {k: _thaw(v) for k, v in self.options},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelSpec:
        """Rebuild a spec from :meth:`to_dict` output (lists are accepted wherever tuples are expected)."""
        missing = [k for k in ("name", "in_shape", "num_classes") if k not in d]
        if missing:
            raise ValueError(
                f"model spec dict is missing key(s) {missing}; required: name, in_shape, num_classes "
                f"(optional: options), got keys {sorted(d)}"
            )
        unknown = sorted(set(d) - {"name", "in_shape", "num_classes", "options"})
        if unknown:
            raise ValueError(
                f"model spec dict has unknown key(s) {unknown}; allowed: name, in_shape, num_classes, options"
            )
        options = d.get("options") or {}
        return cls(
            name=d["name"],
            in_shape=tuple(d["in_shape"]),
            num_classes=d["num_classes"],
            options=tuple(options.items()) if isinstance(options, Mapping) else tuple(options),
        )


# --------------------------------------------------------------------------------------------------------
# Built-in models: each returns one factory per layer so only the needed layers get instantiated
# --------------------------------------------------------------------------------------------------------


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{what} must be a positive int, got {value!r}")
    return value


def _image_shape(in_shape: tuple[int, ...], model: str) -> tuple[int, int, int]:
    if len(in_shape) != 3:
        raise ValueError(
            f"model {model!r} needs in_shape (C, H, W), got {in_shape!r}; use 'mlp' for flat features"
        )
    c, h, w = in_shape
    return c, h, w


def _mlp_head(in_features: int, out_features: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(in_features, out_features), nn.ReLU())


def _linear_relu(in_features: int, out_features: int) -> nn.Module:
    return nn.Sequential(nn.Linear(in_features, out_features), nn.ReLU())


class ResidualLinear(nn.Module):
    """``x + scale * relu(linear(x))``: one hidden layer of the MLP whose input and output widths match.

    Note: why the default MLP is residual.
        The pipeline trains stage ``i`` of ``n`` on gradients ``n - i - 1`` updates old. A plain 6-layer
        ReLU MLP on digits reaches only ~30% after 5 epochs at the demo's lr 0.05 / momentum 0.5 with 3
        stages (the 3-layer MLP it replaced: 95%); the skip connection keeps the deep model as easy to
        train as a shallow one, and ``scale`` (1/sqrt(number of residual layers)) keeps the sum from
        growing with depth, which is what made 6 stages (staleness 5) oscillate.
    """

    def __init__(self, features: int, scale: float = 1.0) -> None:
        super().__init__()
        self.linear = nn.Linear(features, features)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the layer to ``x`` of shape (B, F)."""
        return x + self.scale * torch.relu(self.linear(x))  # (B, F)

    def extra_repr(self) -> str:
        return f"scale={self.scale:g}"


def _mlp(
    in_shape: tuple[int, ...],
    num_classes: int,
    *,
    hidden: Sequence[int] = (128, 128, 128, 128, 128),
    residual: bool = True,
) -> list[LayerFactory]:
    """Flatten+Linear+ReLU, one layer per further hidden size, then Linear to the classes.

    A further hidden layer whose width equals the previous one is a :class:`ResidualLinear` (unless
    ``residual`` is false), otherwise Linear+ReLU. The default has 6 layers, so up to 6 devices can
    share it; ``hidden=[128, 64]`` is the 3-layer MLP that was the default before. Layers keep
    PyTorch's default Linear initialisation.
    """
    if isinstance(hidden, str | bytes) or not isinstance(hidden, Sequence) or len(hidden) < 1:
        # One hidden size (2 layers) is papers/001's 784-512-10 MLP; the pipeline mode checks the depth.
        raise ValueError(
            f"mlp option hidden must be a sequence of at least 1 positive int (giving >= 2 layers), "
            f"got {hidden!r}"
        )
    if not isinstance(residual, bool):
        raise ValueError(f"mlp option residual must be true or false, got {residual!r}")
    sizes = [_positive_int(h, "mlp option hidden entry") for h in hidden]
    in_features = math.prod(in_shape)
    pairs = list(itertools.pairwise(sizes))
    blocks = sum(1 for prev, nxt in pairs if residual and prev == nxt)
    scale = 1.0 / math.sqrt(blocks) if blocks else 1.0
    factories: list[LayerFactory] = [functools.partial(_mlp_head, in_features, sizes[0])]
    for prev, nxt in pairs:
        if residual and prev == nxt:
            factories.append(functools.partial(ResidualLinear, prev, scale))
        else:
            factories.append(functools.partial(_linear_relu, prev, nxt))
    factories.append(functools.partial(nn.Linear, sizes[-1], num_classes))
    return factories


def _conv_relu(in_channels: int, out_channels: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1), nn.ReLU())


def _max_pool() -> nn.Module:
    # ceil_mode keeps odd sizes (and 8x8 digits down to 1x1) from losing their last row/column.
    return nn.MaxPool2d(kernel_size=2, ceil_mode=True)


def _cnn(
    in_shape: tuple[int, ...],
    num_classes: int,
    *,
    channels: Sequence[int] = (8, 16, 32),
    hidden: int = 128,
) -> list[LayerFactory]:
    """The ResPipe CNN "C8, M2, C16, M2, C32, M2, F128, F10" with one conv or pool per layer."""
    c, h, w = _image_shape(in_shape, "cnn")
    if isinstance(channels, str | bytes) or not isinstance(channels, Sequence) or not channels:
        raise ValueError(
            f"cnn option channels must be a non-empty sequence of positive ints, got {channels!r}"
        )
    chans = [_positive_int(ch, "cnn option channels entry") for ch in channels]
    hidden = _positive_int(hidden, "cnn option hidden")
    factories: list[LayerFactory] = []
    prev = c
    for ch in chans:
        factories.append(functools.partial(_conv_relu, prev, ch))
        factories.append(_max_pool)
        prev = ch
        h, w = math.ceil(h / 2), math.ceil(w / 2)  # matches MaxPool2d(2, ceil_mode=True)
    factories.append(functools.partial(_mlp_head, prev * h * w, hidden))
    factories.append(functools.partial(nn.Linear, hidden, num_classes))
    return factories


def _make_divisible(value: float, divisor: int = 8, min_value: int | None = None) -> int:
    """Round channels to a multiple of ``divisor`` without going more than 10% below ``value``."""
    if min_value is None:
        min_value = divisor
    new_value = max(min_value, int(value + divisor / 2) // divisor * divisor)
    if new_value < 0.9 * value:
        new_value += divisor
    return new_value


def _conv_bn_relu6(
    in_channels: int, out_channels: int, kernel: int, stride: int, groups: int = 1
) -> nn.Sequential:
    # Not inplace: a layer's input may be a leaf tensor received from another stage that requires grad.
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU6(),
    )


class InvertedResidual(nn.Module):
    """MobileNetV2 block: 1x1 expand, 3x3 depthwise, 1x1 linear projection, residual when shapes match."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        hidden = round(in_channels * expand_ratio)
        self.use_residual = stride == 1 and in_channels == out_channels
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(_conv_bn_relu6(in_channels, hidden, 1, 1))
        layers += [
            _conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden),
            nn.Conv2d(hidden, out_channels, 1, bias=False),
            nn.BatchNorm2d(out_channels),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block to ``x`` of shape (B, C_in, H, W)."""
        if self.use_residual:
            return x + self.conv(x)  # (B, C, H, W)
        return self.conv(x)  # (B, C_out, H/stride, W/stride)


def _initialised(build: Callable[..., nn.Module], *args: Any, **kwargs: Any) -> nn.Module:
    return mobilenet_init(build(*args, **kwargs))


def _pool_flatten() -> nn.Module:
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())


def _dropout_linear(in_features: int, num_classes: int, dropout: float) -> nn.Module:
    return nn.Sequential(nn.Dropout(dropout), nn.Linear(in_features, num_classes))


# (expansion t, output channels c, repeats n, stride s) from the MobileNetV2 paper.
_MOBILENETV2_CONFIG: tuple[tuple[int, int, int, int], ...] = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def _mobilenetv2(
    in_shape: tuple[int, ...],
    num_classes: int,
    *,
    width_mult: float = 0.5,
    stem_stride: int | None = None,
    last_channel: int | None = None,
    dropout: float = 0.2,
) -> list[LayerFactory]:
    """A small MobileNetV2: stem, one layer per InvertedResidual block, 1x1 conv, pool+flatten, classifier.

    For small inputs (H or W < 32, e.g. 8x8 digits) the stem and the first stride-2 stage use stride 1, so
    the feature map is not reduced below 1x1 before the deeper stages. ``stem_stride`` (1 or 2) overrides
    that automatic choice and applies to both the stem and the first stride-2 stage. ``last_channel``
    defaults to ``max(320, _make_divisible(1280 * width_mult))``.
    """
    c, h, w = _image_shape(in_shape, "mobilenetv2")
    if isinstance(width_mult, bool) or not isinstance(width_mult, int | float) or not width_mult > 0:
        raise ValueError(f"mobilenetv2 option width_mult must be a positive number, got {width_mult!r}")
    if stem_stride is None:
        stem_stride = 1 if min(h, w) < 32 else 2
    if stem_stride not in (1, 2) or isinstance(stem_stride, bool):
        raise ValueError(
            f"mobilenetv2 option stem_stride must be 1, 2 or None (automatic), got {stem_stride!r}"
        )
    if last_channel is None:
        last_channel = max(320, _make_divisible(1280 * width_mult))
    last_channel = _positive_int(last_channel, "mobilenetv2 option last_channel")
    if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"mobilenetv2 option dropout must be a number in [0, 1), got {dropout!r}")

    stem_channels = _make_divisible(32 * width_mult)
    factories: list[LayerFactory] = [
        functools.partial(_initialised, _conv_bn_relu6, c, stem_channels, 3, stem_stride)
    ]
    prev = stem_channels
    first_downsample = True
    for t, ch, n, s in _MOBILENETV2_CONFIG:
        out = _make_divisible(ch * width_mult)
        stage_stride = s
        if s == 2 and first_downsample:
            stage_stride = stem_stride
            first_downsample = False
        for i in range(n):
            stride = stage_stride if i == 0 else 1
            factories.append(functools.partial(_initialised, InvertedResidual, prev, out, stride, t))
            prev = out
    factories.append(functools.partial(_initialised, _conv_bn_relu6, prev, last_channel, 1, 1))
    factories.append(_pool_flatten)
    factories.append(
        functools.partial(_initialised, _dropout_linear, last_channel, num_classes, float(dropout))
    )
    return factories


_REGISTRY: dict[str, Callable[..., list[LayerFactory]]] = {
    "mlp": _mlp,
    "cnn": _cnn,
    "mobilenetv2": _mobilenetv2,
    "vgg5": vgg5,  # PiPar's (papers/003 Table 2), in edgeagent/zoo.py
    "mobilenetv3": mobilenetv3,
}


# --------------------------------------------------------------------------------------------------------
# User models by dotted path
# --------------------------------------------------------------------------------------------------------


def _is_dotted_path(name: str) -> bool:
    return ":" in name or "." in name


def _resolve_dotted(path: str) -> Callable[..., Any]:
    if ":" in path:
        module_name, _, attr_path = path.partition(":")
    else:
        module_name, _, attr_path = path.rpartition(".")
    if not module_name or not attr_path:
        raise ValueError(f"model path {path!r} is not of the form 'pkg.mod:func' or 'pkg.mod.func'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"model path {path!r}: cannot import module {module_name!r} ({exc})") from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(
                f"model path {path!r}: module {module_name!r} has no attribute {attr_path!r}"
            ) from None
    if not callable(obj):
        raise ValueError(f"model path {path!r} names a {type(obj).__name__}, not a callable")
    return obj


def _call_user_model(spec: ModelSpec) -> nn.Sequential:
    """Call the user's function with (in_shape, num_classes, **options) if it accepts them, else with ()."""
    fn = _resolve_dotted(spec.name)
    kwargs: dict[str, Any] = {"in_shape": spec.in_shape, "num_classes": spec.num_classes, **spec.opts()}
    try:
        signature: inspect.Signature | None = inspect.signature(fn)
    except (TypeError, ValueError):
        signature = None
    if signature is not None:
        # Binding first avoids mistaking a TypeError raised inside the user's function for a signature miss.
        try:
            signature.bind(**kwargs)
            accepts_kwargs = True
        except TypeError:
            accepts_kwargs = False
        if not accepts_kwargs and spec.options:
            raise ValueError(
                f"model path {spec.name!r}: function does not accept in_shape, num_classes and options "
                f"{sorted(spec.opts())}"
            )
        model = fn(**kwargs) if accepts_kwargs else fn()
    else:
        try:
            model = fn(**kwargs)
        except TypeError:
            model = fn()
    if not isinstance(model, nn.Sequential):
        raise ValueError(
            f"model path {spec.name!r} returned {type(model).__name__}; it must return an nn.Sequential "
            f"so the model can be cut between layers"
        )
    if len(model) == 0:
        raise ValueError(f"model path {spec.name!r} returned an empty nn.Sequential")
    return model


# --------------------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------------------


def _layer_seed(seed: int, index: int | str) -> int:
    """A stable 63-bit seed for layer ``index``; hashlib rather than hash() so it matches across processes."""
    digest = hashlib.sha256(f"edgeagent.models:{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & 0x7FFF_FFFF_FFFF_FFFF


def _seeded(factory: Callable[[], _M], seed: int) -> _M:
    # fork_rng restores the CPU RNG afterwards so callers' random streams are not disturbed; only the CPU
    # generator is seeded (and layers built on CPU) so CUDA RNG state is never touched.
    with torch.random.fork_rng(devices=[]), torch.device("cpu"):
        torch.default_generator.manual_seed(seed)
        return factory()


def _check_seed(seed: int) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")


def _builtin_factories(spec: ModelSpec) -> list[LayerFactory]:
    fn = _REGISTRY[spec.name]
    allowed = sorted(
        p.name for p in inspect.signature(fn).parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY
    )
    unknown = sorted(set(spec.opts()) - set(allowed))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for model {spec.name!r}; allowed options: {allowed}")
    return fn(spec.in_shape, spec.num_classes, **spec.opts())


def _check_name(spec: ModelSpec) -> None:
    if spec.name not in _REGISTRY and not _is_dotted_path(spec.name):
        raise ValueError(f"unknown model {spec.name!r}; allowed: {', '.join(MODEL_NAMES)} or {_DOTTED_FORMS}")


def num_layers(spec: ModelSpec) -> int:
    """Number of layers (possible cut points + 1) of the model.

    Cheap for built-in models (no layer is instantiated); a user model is built once to count its layers.
    """
    _check_name(spec)
    if spec.name in _REGISTRY:
        return len(_builtin_factories(spec))
    return len(_seeded(lambda: _call_user_model(spec), _layer_seed(0, "user")))


def build_layers(spec: ModelSpec, start: int, end: int, *, seed: int) -> list[nn.Module]:
    """Layers ``[start, end)`` of the model (end exclusive), instantiating only those layers.

    Layer ``j`` is built under a seed derived from ``(seed, j)`` with the global CPU RNG state saved and
    restored around it, so the same layer has bit-identical initial weights whichever device builds it and
    whatever range it is part of, and the caller's RNG is left untouched. Layers are built on CPU; move
    them with ``.to(device)`` afterwards.

    User models (dotted path) are built whole, once, under a seed derived from ``seed`` and then sliced, so
    the memory saving of building only a range applies to built-in models only. Nothing is cached.
    """
    _check_seed(seed)
    _check_name(spec)
    if spec.name in _REGISTRY:
        factories = _builtin_factories(spec)
        total = len(factories)
        _check_range(start, end, total, spec.name)
        return [_seeded(factories[j], _layer_seed(seed, j)) for j in range(start, end)]
    model = _seeded(lambda: _call_user_model(spec), _layer_seed(seed, "user"))
    _check_range(start, end, len(model), spec.name)
    return list(model)[start:end]


def _check_range(start: int, end: int, total: int, name: str) -> None:
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end))
    if not ints or not 0 <= start < end <= total:
        raise ValueError(
            f"layer range [{start!r}, {end!r}) is invalid for model {name!r} with {total} layers; "
            f"need ints with 0 <= start < end <= {total}"
        )


def build_model(spec: ModelSpec, *, seed: int) -> nn.Sequential:
    """All layers as one ``nn.Sequential``; identical to concatenating any split of :func:`build_layers`."""
    _check_seed(seed)
    _check_name(spec)
    if spec.name in _REGISTRY:
        return nn.Sequential(*build_layers(spec, 0, num_layers(spec), seed=seed))
    # Built once rather than via num_layers + build_layers, which would build a user model twice.
    model = _seeded(lambda: _call_user_model(spec), _layer_seed(seed, "user"))
    return nn.Sequential(*list(model))


def layer_output_shapes(spec: ModelSpec, *, batch_size: int = 1) -> list[tuple[int, ...]]:
    """Output shape of each layer, batch dimension included, from a dummy forward on CPU.

    The model runs in eval mode (BatchNorm needs more than one value per channel in train mode) under
    ``torch.no_grad``; the caller's RNG state is not changed.
    """
    _positive_int(batch_size, "batch_size")
    model = build_model(spec, seed=0).eval()
    shapes: list[tuple[int, ...]] = []
    with torch.no_grad():
        x = torch.zeros((batch_size, *spec.in_shape))  # (B, *in_shape)
        for layer in model:
            x = layer(x)
            shapes.append(tuple(x.shape))
    return shapes
