"""Inception-v3 (Szegedy et al. 2016, "Rethinking the Inception architecture for computer
vision"), adapted to 28x28 / 32x32 inputs.

Block structure as in the paper and torchvision's ``Inception3``: stem; 3 x InceptionA
(1x1 / 1x1-5x5 / 1x1-3x3-3x3 / avgpool-1x1, pool widths 32, 64, 64); InceptionB (grid reduction:
3x3 stride 2 / 1x1-3x3-3x3 stride 2 / max-pool); 4 x InceptionC (factorised 7x7 as 1x7 and 7x1,
inner widths 128, 160, 160, 192); InceptionD (grid reduction with 1x7-7x1); 2 x InceptionE
(expanded 1x3 / 3x1 filter banks); global average pool; dropout 0.5; FC. Every convolution is
Conv - BatchNorm(eps 1e-3) - ReLU.

Adaptations, instead of resizing images to 299x299:

- Stem: the five stem convolutions (32, 32, 64, 80, 192 channels) are 3x3 stride 1 with
  padding 1 (the 80 one stays 1x1), and both stem max-pools are removed, so the image enters
  InceptionA at full resolution. The two grid reductions (stride-2, unpadded 3x3) then give
  28 -> 13 -> 6 and 32 -> 15 -> 7; any H, W >= 16 works (final grid >= 3x3).
- Width: every channel count is multiplied by ``width`` (default ``WIDTH = 0.5``, rounded),
  so the final feature width is 1024 rather than 2048 and one CPU step costs about a quarter
  of the full model. ``InceptionV3(..., width=1.0)`` gives the full widths (21.8 M parameters
  for 3 channels and 10 classes, the same as torchvision's without the auxiliary head).
- The auxiliary classifier is omitted (it only serves as a regulariser at 299x299).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._layers import conv_bn_act, init_weights
from .registry import InputShape, register

WIDTH = 0.5
_BN_EPS = 1e-3

Scale = Callable[[int], int]


def _conv(in_channels: int, out_channels: int, kernel_size, stride: int = 1, padding=0) -> nn.Sequential:
    return conv_bn_act(in_channels, out_channels, kernel_size, stride, padding, bn_eps=_BN_EPS)


class InceptionA(nn.Module):
    """35x35-grid module (Fig. 5): 1x1 | 1x1-5x5 | 1x1-3x3-3x3 | avgpool-1x1."""

    def __init__(self, in_channels: int, pool_features: int, s: Scale):
        super().__init__()
        self.branch1x1 = _conv(in_channels, s(64), 1)
        self.branch5x5 = nn.Sequential(_conv(in_channels, s(48), 1), _conv(s(48), s(64), 5, padding=2))
        self.branch3x3dbl = nn.Sequential(
            _conv(in_channels, s(64), 1),
            _conv(s(64), s(96), 3, padding=1),
            _conv(s(96), s(96), 3, padding=1),
        )
        self.branch_pool = _conv(in_channels, s(pool_features), 1)
        self.out_channels = s(64) + s(64) + s(96) + s(pool_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pool = self.branch_pool(F.avg_pool2d(x, 3, stride=1, padding=1))
        return torch.cat([self.branch1x1(x), self.branch5x5(x), self.branch3x3dbl(x), pool], 1)


class InceptionB(nn.Module):
    """First grid reduction: 3x3/2 | 1x1-3x3-3x3/2 | maxpool 3x3/2."""

    def __init__(self, in_channels: int, s: Scale):
        super().__init__()
        self.branch3x3 = _conv(in_channels, s(384), 3, stride=2)
        self.branch3x3dbl = nn.Sequential(
            _conv(in_channels, s(64), 1),
            _conv(s(64), s(96), 3, padding=1),
            _conv(s(96), s(96), 3, stride=2),
        )
        self.out_channels = s(384) + s(96) + in_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pool = F.max_pool2d(x, 3, stride=2)
        return torch.cat([self.branch3x3(x), self.branch3x3dbl(x), pool], 1)


class InceptionC(nn.Module):
    """17x17-grid module (Fig. 6): 1x1 | 1x1-1x7-7x1 | 1x1-7x1-1x7-7x1-1x7 | avgpool-1x1."""

    def __init__(self, in_channels: int, channels_7x7: int, s: Scale):
        super().__init__()
        c7 = s(channels_7x7)
        self.branch1x1 = _conv(in_channels, s(192), 1)
        self.branch7x7 = nn.Sequential(
            _conv(in_channels, c7, 1),
            _conv(c7, c7, (1, 7), padding=(0, 3)),
            _conv(c7, s(192), (7, 1), padding=(3, 0)),
        )
        self.branch7x7dbl = nn.Sequential(
            _conv(in_channels, c7, 1),
            _conv(c7, c7, (7, 1), padding=(3, 0)),
            _conv(c7, c7, (1, 7), padding=(0, 3)),
            _conv(c7, c7, (7, 1), padding=(3, 0)),
            _conv(c7, s(192), (1, 7), padding=(0, 3)),
        )
        self.branch_pool = _conv(in_channels, s(192), 1)
        self.out_channels = 4 * s(192)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pool = self.branch_pool(F.avg_pool2d(x, 3, stride=1, padding=1))
        return torch.cat([self.branch1x1(x), self.branch7x7(x), self.branch7x7dbl(x), pool], 1)


class InceptionD(nn.Module):
    """Second grid reduction: 1x1-3x3/2 | 1x1-1x7-7x1-3x3/2 | maxpool 3x3/2."""

    def __init__(self, in_channels: int, s: Scale):
        super().__init__()
        self.branch3x3 = nn.Sequential(_conv(in_channels, s(192), 1), _conv(s(192), s(320), 3, stride=2))
        self.branch7x7x3 = nn.Sequential(
            _conv(in_channels, s(192), 1),
            _conv(s(192), s(192), (1, 7), padding=(0, 3)),
            _conv(s(192), s(192), (7, 1), padding=(3, 0)),
            _conv(s(192), s(192), 3, stride=2),
        )
        self.out_channels = s(320) + s(192) + in_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pool = F.max_pool2d(x, 3, stride=2)
        return torch.cat([self.branch3x3(x), self.branch7x7x3(x), pool], 1)


class InceptionE(nn.Module):
    """8x8-grid module (Fig. 7): 1x1 | 1x1-(1x3, 3x1) | 1x1-3x3-(1x3, 3x1) | avgpool-1x1."""

    def __init__(self, in_channels: int, s: Scale):
        super().__init__()
        self.branch1x1 = _conv(in_channels, s(320), 1)
        self.branch3x3_1 = _conv(in_channels, s(384), 1)
        self.branch3x3_2a = _conv(s(384), s(384), (1, 3), padding=(0, 1))
        self.branch3x3_2b = _conv(s(384), s(384), (3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = _conv(in_channels, s(448), 1)
        self.branch3x3dbl_2 = _conv(s(448), s(384), 3, padding=1)
        self.branch3x3dbl_3a = _conv(s(384), s(384), (1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = _conv(s(384), s(384), (3, 1), padding=(1, 0))
        self.branch_pool = _conv(in_channels, s(192), 1)
        self.out_channels = s(320) + 4 * s(384) + s(192)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.branch3x3_1(x)
        b = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        pool = self.branch_pool(F.avg_pool2d(x, 3, stride=1, padding=1))
        return torch.cat(
            [
                self.branch1x1(x),
                self.branch3x3_2a(a), self.branch3x3_2b(a),
                self.branch3x3dbl_3a(b), self.branch3x3dbl_3b(b),
                pool,
            ],
            1,
        )


class InceptionV3(nn.Module):
    """Inception-v3 without auxiliary head, small-input stem, channel widths times ``width``."""

    def __init__(self, input_shape: InputShape, num_classes: int, width: float = WIDTH, dropout: float = 0.5):
        super().__init__()
        if not width > 0:
            raise ValueError(f"width must be positive, got {width!r}")

        def s(channels: int) -> int:
            return max(1, int(round(channels * width)))

        self.stem = nn.Sequential(
            _conv(input_shape[0], s(32), 3, padding=1),
            _conv(s(32), s(32), 3, padding=1),
            _conv(s(32), s(64), 3, padding=1),
            _conv(s(64), s(80), 1),
            _conv(s(80), s(192), 3, padding=1),
        )
        blocks: list[nn.Module] = []
        c = s(192)

        def add(block: nn.Module) -> None:
            nonlocal c
            blocks.append(block)
            c = block.out_channels

        for pool_features in (32, 64, 64):
            add(InceptionA(c, pool_features, s))
        add(InceptionB(c, s))
        for c7 in (128, 160, 160, 192):
            add(InceptionC(c, c7, s))
        add(InceptionD(c, s))
        add(InceptionE(c, s))
        add(InceptionE(c, s))
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(c, num_classes)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(self.dropout(torch.flatten(self.pool(x), 1)))


@register("inception-v3", min_size=16)
def inception_v3(input_shape: InputShape, num_classes: int) -> nn.Module:
    return InceptionV3(input_shape, num_classes)
