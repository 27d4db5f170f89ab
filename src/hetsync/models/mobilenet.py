"""MobileNets, adapted to small inputs by removing early strides.

- ``mobilenet-v1`` (Howard et al. 2017, "MobileNets: efficient CNNs for mobile vision"):
  conv3x3 (32) then 13 depthwise-separable blocks (depthwise 3x3 - BN - ReLU - pointwise 1x1 -
  BN - ReLU) with widths 64, 128x2, 256x2, 512x6, 1024x2; width multiplier 1.0; global average
  pool; FC. Adaptation: the stem conv has stride 1 instead of 2 (the four stride-2 blocks are
  kept), so 28x28 -> 2x2 and 32x32 -> 2x2 at the last block.
- ``mobilenet-v2`` (Sandler et al. 2018, "MobileNetV2: inverted residuals and linear
  bottlenecks"): conv3x3 (32) then inverted residual blocks (1x1 expand by t - BN - ReLU6 -
  depthwise 3x3 - BN - ReLU6 - 1x1 project - BN, no activation; identity shortcut when stride
  is 1 and widths match) with (t, c, n, s) = (1,16,1,1), (6,24,2,1*), (6,32,3,2), (6,64,4,2),
  (6,96,3,1), (6,160,3,2), (6,320,1,1); conv1x1 to 1280 - BN - ReLU6; global average pool; FC.
  Adaptation: the stem and the first 24-channel stage (*) use stride 1 instead of 2, as in
  the common CIFAR version, so 28x28 -> 4x4 and 32x32 -> 4x4 at the last block. The
  classifier dropout of some implementations is omitted, as in the paper's table.

Both use BatchNorm after every convolution; any H, W >= 16 works.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ._layers import conv_bn_act, init_weights
from .registry import InputShape, register

# (output width, stride) of MobileNet-v1's depthwise-separable blocks.
_V1_BLOCKS = [
    (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2),
    (512, 1), (512, 1), (512, 1), (512, 1), (512, 1), (1024, 2), (1024, 1),
]

# (expansion t, output width c, repeats n, first stride s); stage 2's stride 2 -> 1.
_V2_STAGES = [
    (1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2),
    (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1),
]


def _depthwise_separable(in_channels: int, out_channels: int, stride: int) -> nn.Sequential:
    return nn.Sequential(
        conv_bn_act(in_channels, in_channels, 3, stride, 1, groups=in_channels),
        conv_bn_act(in_channels, out_channels, 1),
    )


class MobileNetV1(nn.Module):
    """MobileNet-v1 (width 1.0) with a stride-1 stem; see the module docstring."""

    def __init__(self, input_shape: InputShape, num_classes: int):
        super().__init__()
        layers: list[nn.Module] = [conv_bn_act(input_shape[0], 32, 3, 1, 1)]
        width = 32
        for out, stride in _V1_BLOCKS:
            layers.append(_depthwise_separable(width, out, stride))
            width = out
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(width, num_classes)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.features(x)), 1))


class InvertedResidual(nn.Module):
    """1x1 expand (skipped when t = 1) - depthwise 3x3 - linear 1x1 project, ReLU6, BN."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, expansion: int):
        super().__init__()
        hidden = in_channels * expansion
        layers: list[nn.Module] = []
        if expansion != 1:
            layers.append(conv_bn_act(in_channels, hidden, 1, act=nn.ReLU6))
        layers += [
            conv_bn_act(hidden, hidden, 3, stride, 1, groups=hidden, act=nn.ReLU6),
            conv_bn_act(hidden, out_channels, 1, act=None),
        ]
        self.body = nn.Sequential(*layers)
        self.use_residual = stride == 1 and in_channels == out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.use_residual else y


class MobileNetV2(nn.Module):
    """MobileNet-v2 (width 1.0) with reduced early strides; see the module docstring."""

    def __init__(self, input_shape: InputShape, num_classes: int, last_width: int = 1280):
        super().__init__()
        layers: list[nn.Module] = [conv_bn_act(input_shape[0], 32, 3, 1, 1, act=nn.ReLU6)]
        width = 32
        for t, c, n, s in _V2_STAGES:
            for i in range(n):
                layers.append(InvertedResidual(width, c, s if i == 0 else 1, t))
                width = c
        layers.append(conv_bn_act(width, last_width, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(last_width, num_classes)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.features(x)), 1))


@register("mobilenet-v1", min_size=16)
def mobilenet_v1(input_shape: InputShape, num_classes: int) -> nn.Module:
    return MobileNetV1(input_shape, num_classes)


@register("mobilenet-v2", min_size=16)
def mobilenet_v2(input_shape: InputShape, num_classes: int) -> nn.Module:
    return MobileNetV2(input_shape, num_classes)
