"""Small building blocks and the initialisation shared by the model families."""

from __future__ import annotations

import torch.nn as nn


def init_weights(model: nn.Module) -> nn.Module:
    """Standard initialisation, in place; returns ``model``.

    He et al. 2015 ("Delving deep into rectifiers"): convolutions Kaiming-normal with fan-out
    and ReLU gain (as torchvision's ResNets); linear layers Kaiming-normal with fan-in and ReLU
    gain (PyTorch's default Linear init has a third of that variance, which shrinks the signal
    through a stack of FC layers and made LeNet learn several times slower); biases 0;
    BatchNorm weight 1, bias 0. Uses only torch's global RNG.
    """
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d) and m.affine:
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    return model


def conv_bn_act(
    in_channels: int,
    out_channels: int,
    kernel_size: int | tuple[int, int],
    stride: int = 1,
    padding: int | tuple[int, int] = 0,
    groups: int = 1,
    act: type[nn.Module] | None = nn.ReLU,
    bn_eps: float = 1e-5,
) -> nn.Sequential:
    """Conv2d (no bias) -> BatchNorm2d -> activation (``act=None`` for a linear output)."""
    layers: list[nn.Module] = [
        nn.Conv2d(
            in_channels, out_channels, kernel_size, stride=stride, padding=padding,
            groups=groups, bias=False,
        ),
        nn.BatchNorm2d(out_channels, eps=bn_eps),
    ]
    if act is not None:
        layers.append(act(inplace=True))
    return nn.Sequential(*layers)
