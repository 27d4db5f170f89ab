"""ResNets: v1 (He et al. 2015, "Deep residual learning for image recognition") and v2
(He et al. 2016, "Identity mappings in deep residual networks", pre-activation).

- ``resnet18-v1``: BasicBlock (two 3x3 convs), stages [2, 2, 2, 2], widths 64-128-256-512.
- ``resnet50-v1``: Bottleneck (1x1 -> 3x3 -> 1x1, expansion 4), stages [3, 4, 6, 3]. As in the
  paper and Gluon's ``resnet50_v1`` (the model ESync measured), a stage's stride sits on the
  first 1x1 conv (not on the 3x3 as in the later "v1.5"). Projection shortcuts (1x1 conv + BN)
  where the shape changes.
- ``resnet50-v2``: pre-activation Bottleneck (BN -> ReLU -> conv, three times; stride on the
  3x3), stages [3, 4, 6, 3]; the shortcut projection is applied to the pre-activated input; the
  network ends with BN -> ReLU before pooling. Like Gluon's ``resnet50_v2`` it starts with a
  BatchNorm without affine parameters that normalises the raw input.

Small-input adaptation (the "thumbnail"/CIFAR stem): a 3x3 stride-1 conv replaces the 7x7/2
conv and the 3x3/2 max-pool, so 28x28 and 32x32 inputs reach the last stage at 4x4 (the
stages' strides 1, 2, 2, 2 are kept). Global average pooling makes any H, W >= 16 work.
Convs are Kaiming-initialised; BatchNorm starts at weight 1, bias 0.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ._layers import init_weights
from .registry import InputShape, register


def _conv3x3(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)


def _conv1x1(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False)


class BasicBlockV1(nn.Module):
    """conv3x3(stride) - BN - ReLU - conv3x3 - BN, plus shortcut, then ReLU."""

    expansion = 1

    def __init__(self, in_channels: int, planes: int, stride: int = 1):
        super().__init__()
        out = planes * self.expansion
        self.conv1 = _conv3x3(in_channels, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, out)
        self.bn2 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _projection(in_channels, out, stride, bn=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.relu(y + identity)


class BottleneckV1(nn.Module):
    """conv1x1(stride) - BN - ReLU - conv3x3 - BN - ReLU - conv1x1 - BN, plus shortcut, ReLU."""

    expansion = 4

    def __init__(self, in_channels: int, planes: int, stride: int = 1):
        super().__init__()
        out = planes * self.expansion
        self.conv1 = _conv1x1(in_channels, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = _conv1x1(planes, out)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _projection(in_channels, out, stride, bn=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return self.relu(y + identity)


class BottleneckV2(nn.Module):
    """Pre-activation bottleneck: (BN - ReLU - conv) x 3 with 1x1, 3x3(stride), 1x1 convs."""

    expansion = 4

    def __init__(self, in_channels: int, planes: int, stride: int = 1):
        super().__init__()
        out = planes * self.expansion
        self.bn1 = nn.BatchNorm2d(in_channels)
        self.conv1 = _conv1x1(in_channels, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn3 = nn.BatchNorm2d(planes)
        self.conv3 = _conv1x1(planes, out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _projection(in_channels, out, stride, bn=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = self.relu(self.bn1(x))
        identity = x if self.downsample is None else self.downsample(pre)
        y = self.conv1(pre)
        y = self.conv2(self.relu(self.bn2(y)))
        y = self.conv3(self.relu(self.bn3(y)))
        return y + identity


def _projection(in_channels: int, out_channels: int, stride: int, bn: bool) -> nn.Module | None:
    if stride == 1 and in_channels == out_channels:
        return None
    conv = _conv1x1(in_channels, out_channels, stride)
    return nn.Sequential(conv, nn.BatchNorm2d(out_channels)) if bn else conv


def _make_stages(block: type[nn.Module], layers: list[int], in_channels: int) -> tuple[nn.Sequential, int]:
    stages = []
    for i, (n_blocks, planes) in enumerate(zip(layers, (64, 128, 256, 512))):
        stride = 1 if i == 0 else 2
        blocks = []
        for j in range(n_blocks):
            blocks.append(block(in_channels, planes, stride if j == 0 else 1))
            in_channels = planes * block.expansion
        stages.append(nn.Sequential(*blocks))
    return nn.Sequential(*stages), in_channels


class ResNetV1(nn.Module):
    """Thumbnail-stem ResNet v1: conv3x3 - BN - ReLU, four stages, global avg pool, FC."""

    def __init__(self, block: type[nn.Module], layers: list[int], input_shape: InputShape, num_classes: int):
        super().__init__()
        c = input_shape[0]
        self.stem = nn.Sequential(_conv3x3(c, 64), nn.BatchNorm2d(64), nn.ReLU(inplace=True))
        self.stages, width = _make_stages(block, layers, 64)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(width, num_classes)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.fc(torch.flatten(self.pool(x), 1))


class ResNetV2(nn.Module):
    """Thumbnail-stem pre-activation ResNet: input BN, conv3x3, four stages, BN - ReLU, pool, FC."""

    def __init__(self, block: type[nn.Module], layers: list[int], input_shape: InputShape, num_classes: int):
        super().__init__()
        c = input_shape[0]
        self.stem = nn.Sequential(nn.BatchNorm2d(c, affine=False), _conv3x3(c, 64))
        self.stages, width = _make_stages(block, layers, 64)
        self.post = nn.Sequential(nn.BatchNorm2d(width), nn.ReLU(inplace=True))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(width, num_classes)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.post(self.stages(self.stem(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


@register("resnet18-v1", min_size=16)
def resnet18_v1(input_shape: InputShape, num_classes: int) -> nn.Module:
    return ResNetV1(BasicBlockV1, [2, 2, 2, 2], input_shape, num_classes)


@register("resnet50-v1", min_size=16)
def resnet50_v1(input_shape: InputShape, num_classes: int) -> nn.Module:
    return ResNetV1(BottleneckV1, [3, 4, 6, 3], input_shape, num_classes)


@register("resnet50-v2", min_size=16)
def resnet50_v2(input_shape: InputShape, num_classes: int) -> nn.Module:
    return ResNetV2(BottleneckV2, [3, 4, 6, 3], input_shape, num_classes)
