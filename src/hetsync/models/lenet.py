"""LeNet-5 (LeCun et al. 1998, "Gradient-based learning applied to document recognition").

conv(C->6, 5x5, pad 2) - ReLU - maxpool 2 - conv(6->16, 5x5) - ReLU - maxpool 2
- Linear(16*h*w, 120) - ReLU - Linear(120, 84) - ReLU - Linear(84, classes).

Adaptations: ReLU and max-pooling instead of the original scaled tanh and trainable
subsampling; the first convolution is padded by 2 so a 28x28 image yields the classic 5x5
feature map (and 32x32 yields 6x6). The flattened size is computed from the input shape, so
any H, W >= 12 works. This is the demo's default model: ~62 k parameters, fast on a CPU.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ._layers import init_weights
from .registry import InputShape, register


def _after_conv_pool(size: int) -> int:
    size = size // 2          # conv1 (5x5, pad 2) keeps the size; pool halves it
    size = size - 4           # conv2 (5x5, no pad)
    return size // 2          # pool


class LeNet5(nn.Module):
    """LeNet-5 with ReLU/max-pool; see the module docstring."""

    def __init__(self, input_shape: InputShape, num_classes: int):
        super().__init__()
        c, h, w = input_shape
        self.features = nn.Sequential(
            nn.Conv2d(c, 6, kernel_size=5, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, kernel_size=5),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )
        flat = 16 * _after_conv_pool(h) * _after_conv_pool(w)
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(flat, 120),
            nn.ReLU(inplace=True),
            nn.Linear(120, 84),
            nn.ReLU(inplace=True),
            nn.Linear(84, num_classes),
        )
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


@register("lenet", min_size=12)
def lenet(input_shape: InputShape, num_classes: int) -> nn.Module:
    return LeNet5(input_shape, num_classes)
