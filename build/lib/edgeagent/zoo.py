"""PiPar's small models (papers/003 Table 2) as layer lists: VGG-5 and MobileNetV3-Small.

Each function returns one factory per layer, as :mod:`edgeagent.models` expects of its registry, and each
layer is one cut point: the table's rows are the layers (VGG-5 has 5, MobileNetV3-Small 15), so P ranges
over [1, 5] and [1, 15] as in the paper's Sec. 5.4. Both are sized for 28x28 or 32x32 inputs with any
number of channels (and still work on 8x8). This module imports nothing from ``edgeagent.models`` so that
``models`` can register these functions without an import cycle.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["SqueezeExcitation", "V3Block", "mobilenetv3", "vgg5"]

LayerFactory = Callable[[], nn.Module]


def _image(in_shape: tuple[int, ...], model: str) -> tuple[int, int, int]:
    if len(in_shape) != 3:
        raise ValueError(f"model {model!r} needs in_shape (C, H, W), got {in_shape!r}")
    c, h, w = in_shape
    return c, h, w


def _conv_block(in_channels: int, out_channels: int, pool: bool, batch_norm: bool) -> nn.Module:
    layers: list[nn.Module] = [nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1)]
    if batch_norm:
        layers.append(nn.BatchNorm2d(out_channels))
    layers.append(nn.ReLU())
    if pool:
        # ceil_mode: odd sizes (7x7) keep their last row and 8x8 still halves cleanly.
        layers.append(nn.MaxPool2d(kernel_size=2, ceil_mode=True))
    return nn.Sequential(*layers)


def _flatten_linear_relu(in_features: int, out_features: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(in_features, out_features), nn.ReLU())


def vgg5(
    in_shape: tuple[int, ...],
    num_classes: int,
    *,
    batch_norm: bool = True,
    hidden: int = 128,
) -> list[LayerFactory]:
    """VGG-5: CONV-3-32, CONV-3-64, CONV-3-64, FC-128, FC-X (papers/003 Table 2).

    As in PiPar's code (the VGG of FedAdapt it builds on), each convolution has BatchNorm and ReLU and the
    first two are followed by a 2x2 max pool, which belongs to the same layer (cut point): 28x28 gives
    64x7x7 features to FC-128, 32x32 gives 64x8x8.
    """
    c, h, w = _image(in_shape, "vgg5")
    if not isinstance(batch_norm, bool):
        raise ValueError(f"vgg5 option batch_norm must be true or false, got {batch_norm!r}")
    if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
        raise ValueError(f"vgg5 option hidden must be a positive int, got {hidden!r}")
    for _ in range(2):
        h, w = math.ceil(h / 2), math.ceil(w / 2)  # MaxPool2d(2, ceil_mode=True)
    return [
        functools.partial(_conv_block, c, 32, True, batch_norm),
        functools.partial(_conv_block, 32, 64, True, batch_norm),
        functools.partial(_conv_block, 64, 64, False, batch_norm),
        functools.partial(_flatten_linear_relu, 64 * h * w, hidden),
        functools.partial(nn.Linear, hidden, num_classes),
    ]


# ----------------------------------------------------------------------------------------------------------
# MobileNetV3-Small
# ----------------------------------------------------------------------------------------------------------


def _divisible(value: float, divisor: int = 8) -> int:
    """Channels rounded to a multiple of 8, never more than 10% below ``value`` (torchvision's rule)."""
    new = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * value else new


def _conv_bn(
    in_c: int, out_c: int, kernel: int, stride: int, act: type[nn.Module] | None, groups: int = 1
) -> nn.Sequential:
    layers: list[nn.Module] = [
        nn.Conv2d(in_c, out_c, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(out_c),
    ]
    if act is not None:
        layers.append(act())  # not inplace: a layer's input may be a received leaf that requires grad
    return nn.Sequential(*layers)


class SqueezeExcitation(nn.Module):
    """``x * hardsigmoid(fc2(relu(fc1(avgpool(x)))))`` over channels."""

    def __init__(self, channels: int, squeeze: int) -> None:
        super().__init__()
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Rescale the channels of ``x`` (B, C, H, W)."""
        scale = nn.functional.adaptive_avg_pool2d(x, 1)  # (B, C, 1, 1)
        scale = self.fc2(torch.relu(self.fc1(scale)))
        return x * nn.functional.hardsigmoid(scale)  # (B, C, H, W)


class V3Block(nn.Module):
    """MobileNetV3's bneck: 1x1 expand, kxk depthwise, optional SE, 1x1 linear projection, residual."""

    def __init__(
        self, in_c: int, kernel: int, expanded: int, out_c: int, se: bool, act: type[nn.Module], stride: int
    ) -> None:
        super().__init__()
        self.use_residual = stride == 1 and in_c == out_c
        layers: list[nn.Module] = []
        if expanded != in_c:
            layers.append(_conv_bn(in_c, expanded, 1, 1, act))
        layers.append(_conv_bn(expanded, expanded, kernel, stride, act, groups=expanded))
        if se:
            layers.append(SqueezeExcitation(expanded, _divisible(expanded // 4)))
        layers.append(_conv_bn(expanded, out_c, 1, 1, None))
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block to ``x`` (B, C_in, H, W)."""
        out = self.block(x)  # (B, C_out, H/stride, W/stride)
        return x + out if self.use_residual else out


# (input, kernel, expanded, output, SE, activation, stride): torchvision's mobilenet_v3_small, 11 bnecks
# in Table 2's rows BNECK-3-16, BNECK-3-24 x2, BNECK-5-40 x3, BNECK-5-48 x2, BNECK-5-96 x3.
_V3_SMALL: tuple[tuple[int, int, int, int, bool, type[nn.Module], int], ...] = (
    (16, 3, 16, 16, True, nn.ReLU, 2),
    (16, 3, 72, 24, False, nn.ReLU, 2),
    (24, 3, 88, 24, False, nn.ReLU, 1),
    (24, 5, 96, 40, True, nn.Hardswish, 2),
    (40, 5, 240, 40, True, nn.Hardswish, 1),
    (40, 5, 240, 40, True, nn.Hardswish, 1),
    (40, 5, 120, 48, True, nn.Hardswish, 1),
    (48, 5, 144, 48, True, nn.Hardswish, 1),
    (48, 5, 288, 96, True, nn.Hardswish, 2),
    (96, 5, 576, 96, True, nn.Hardswish, 1),
    (96, 5, 576, 96, True, nn.Hardswish, 1),
)


def mobilenet_init(module: nn.Module) -> nn.Module:
    """torchvision's MobileNetV2 and V3 initialisation (they are the same), applied per layer so it stays
    under the layer's seed."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.01)
            nn.init.zeros_(m.bias)
    return module


def _init(build: Callable[..., nn.Module], *args: Any) -> nn.Module:
    return mobilenet_init(build(*args))


def _pool_linear(in_features: int, out_features: int) -> nn.Module:
    # Table 2's CONV-1-1024 on a 1x1 map: pool, then the 1x1 convolution as a Linear (torchvision's form).
    return nn.Sequential(
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(in_features, out_features), nn.Hardswish()
    )


def _dropout_linear(in_features: int, num_classes: int, dropout: float) -> nn.Module:
    return nn.Sequential(nn.Dropout(dropout), nn.Linear(in_features, num_classes))


def mobilenetv3(
    in_shape: tuple[int, ...],
    num_classes: int,
    *,
    stem_stride: int | None = None,
    dropout: float = 0.2,
) -> list[LayerFactory]:
    """MobileNetV3-Small: CONV-3-16, 11 bnecks, CONV-1-576, CONV-1-1024, FC-X (15 layers, Table 2).

    The stem has stride 1 for inputs under 64x64 (``stem_stride`` overrides), so 28x28 and 32x32 keep a
    2x2 map before the last convolution instead of reaching 1x1 at the third stage.
    """
    c, h, w = _image(in_shape, "mobilenetv3")
    if stem_stride is None:
        stem_stride = 1 if min(h, w) < 64 else 2
    if isinstance(stem_stride, bool) or stem_stride not in (1, 2):
        raise ValueError(
            f"mobilenetv3 option stem_stride must be 1, 2 or None (automatic), got {stem_stride!r}"
        )
    if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"mobilenetv3 option dropout must be a number in [0, 1), got {dropout!r}")
    factories: list[LayerFactory] = [functools.partial(_init, _conv_bn, c, 16, 3, stem_stride, nn.Hardswish)]
    for cfg in _V3_SMALL:
        factories.append(functools.partial(_init, V3Block, *cfg))
    factories.append(functools.partial(_init, _conv_bn, 96, 576, 1, 1, nn.Hardswish))
    factories.append(functools.partial(_init, _pool_linear, 576, 1024))
    factories.append(functools.partial(_init, _dropout_linear, 1024, num_classes, float(dropout)))
    return factories
