"""Model zoo: the architectures ESync was measured with, re-implemented for small inputs.

    from hetsync.models import MODEL_NAMES, build_model, count_parameters
    model = build_model("resnet18-v1", (1, 28, 28), num_classes=10)

Every image model maps ``(N, C, H, W)`` floats to ``(N, num_classes)`` logits, runs on 28x28
(Fashion-MNIST) and 32x32 (CIFAR-10) inputs without resizing; ``gpt-char`` maps ``(N, T)``
character ids to ``(N, vocab, T)`` logits (Shakespeare). Every one is reproducible under
``torch.manual_seed``. Each family's module docstring states its architecture, its paper and
how it was adapted to small inputs.

A new family is one file that decorates its builder with ``@register("name", min_size=...)``
plus one import line below.
"""

from .registry import (
    ModelSpec,
    available_models,
    build_model,
    count_parameters,
    get_spec,
    register,
    unregister,
    validate_input_shape,
)

# One line per family; import order is the order of MODEL_NAMES.
from . import mlp, lenet, alexnet, resnet, mobilenet, inception, gpt  # noqa: E402,F401  (registers)

MODEL_NAMES: tuple[str, ...] = available_models()

__all__ = [
    "MODEL_NAMES",
    "ModelSpec",
    "available_models",
    "build_model",
    "count_parameters",
    "get_spec",
    "register",
    "unregister",
    "validate_input_shape",
]
