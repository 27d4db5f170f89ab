"""Multi-layer perceptron: flatten -> 256 -> 128 -> classes, ReLU (He-initialised).

The smallest model of the zoo, for smoke runs and quick tests; it takes any input size.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ._layers import init_weights
from .registry import InputShape, register


class MLP(nn.Module):
    """Flatten, then Linear(C*H*W, 256) - ReLU - Linear(256, 128) - ReLU - Linear(128, classes)."""

    def __init__(self, input_shape: InputShape, num_classes: int, hidden: tuple[int, ...] = (256, 128)):
        super().__init__()
        c, h, w = input_shape
        layers: list[nn.Module] = [nn.Flatten()]
        width = c * h * w
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU(inplace=True)]
            width = size
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@register("mlp", min_size=1)
def mlp(input_shape: InputShape, num_classes: int) -> nn.Module:
    return MLP(input_shape, num_classes)
