"""AlexNet (Krizhevsky et al. 2012, "ImageNet classification with deep CNNs"), small-input form.

Five convolutions with ReLU and overlapping 3x3/2 max-pooling, then three fully connected
layers with dropout 0.5, as in the original. Adaptations for 28x28 / 32x32 inputs (the usual
CIFAR-style AlexNet), instead of resizing to 224:

- conv1 is 5x5 stride 1 (pad 2) rather than 11x11 stride 4; conv2 5x5, conv3-5 3x3 (pad 1);
- channels 64-192-384-256-256 (the single-GPU widths of torchvision's AlexNet);
- max-pools are 3x3 stride 2 with padding 1, so each halves the size (rounding up):
  28 -> 14 -> 7 -> 4 and 32 -> 16 -> 8 -> 4;
- hidden FC layers have 1024 units instead of 4096; no local response normalisation.

The flattened size is computed from the input shape; any H, W >= 8 works.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ._layers import init_weights
from .registry import InputShape, register


def _pooled(size: int) -> int:
    for _ in range(3):
        size = (size - 1) // 2 + 1  # MaxPool2d(3, stride 2, padding 1)
    return size


class AlexNetSmall(nn.Module):
    """CIFAR-style AlexNet; see the module docstring."""

    def __init__(self, input_shape: InputShape, num_classes: int, hidden: int = 1024, dropout: float = 0.5):
        super().__init__()
        c, h, w = input_shape

        def pool() -> nn.Module:
            return nn.MaxPool2d(kernel_size=3, stride=2, padding=1)

        self.features = nn.Sequential(
            nn.Conv2d(c, 64, kernel_size=5, padding=2), nn.ReLU(inplace=True), pool(),
            nn.Conv2d(64, 192, kernel_size=5, padding=2), nn.ReLU(inplace=True), pool(),
            nn.Conv2d(192, 384, kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, kernel_size=3, padding=1), nn.ReLU(inplace=True), pool(),
        )
        flat = 256 * _pooled(h) * _pooled(w)
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Dropout(dropout),
            nn.Linear(flat, hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            nn.Linear(hidden, hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, num_classes),
        )
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


@register("alexnet", min_size=8)
def alexnet(input_shape: InputShape, num_classes: int) -> nn.Module:
    return AlexNetSmall(input_shape, num_classes)
