"""Model registry: a name maps to a builder, and `build_model` validates what it is given.

Adding a family is one file plus one line: the file defines a builder
``fn(input_shape, num_classes) -> nn.Module`` decorated with ``@register("name", min_size=...)``,
and the line imports that file in ``hetsync.models.__init__``. Registration order is the order
of `available_models()` (and so of ``MODEL_NAMES``).

Every builder receives an already validated ``input_shape`` and ``num_classes >= 2``; it never
has to check them. An image model (``inputs="image"``) gets ``(C, H, W)`` (three positive ints,
``1 <= C <= 4``, ``H, W >= min_size``) and classes; a token model (``inputs="tokens"``) gets
``(context,)`` and the vocabulary's size, plus its size options as keywords.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch.nn as nn

InputShape = tuple[int, int, int]
Builder = Callable[[InputShape, int], nn.Module]

MAX_CHANNELS = 4


@dataclass(frozen=True)
class ModelSpec:
    """One registered model: its name, builder, the smallest H and W it accepts, and what it
    reads: ``"image"`` batches (N, C, H, W) or ``"tokens"`` (N, T)."""

    name: str
    builder: Builder
    min_size: int
    inputs: str = "image"


_REGISTRY: dict[str, ModelSpec] = {}


INPUTS = ("image", "tokens")


def register(name: str, *, min_size: int = 1, inputs: str = "image") -> Callable[[Builder], Builder]:
    """Decorator that registers ``builder`` under ``name``.

    ``min_size`` is the smallest height and width the architecture accepts (below it a
    downsampling stage would reach zero size or BatchNorm would see one value per channel).
    Registering a name twice raises ``ValueError``.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"model name must be a non-empty string, got {name!r}")
    if not isinstance(min_size, int) or isinstance(min_size, bool) or min_size < 1:
        raise ValueError(f"min_size must be a positive int, got {min_size!r}")
    if inputs not in INPUTS:
        raise ValueError(f"inputs must be one of {', '.join(INPUTS)}, got {inputs!r}")

    def decorator(builder: Builder) -> Builder:
        if name in _REGISTRY:
            raise ValueError(f"model {name!r} is already registered")
        _REGISTRY[name] = ModelSpec(name=name, builder=builder, min_size=min_size, inputs=inputs)
        return builder

    return decorator


def unregister(name: str) -> None:
    """Remove ``name`` from the registry (for tests and plugins); unknown names raise."""
    get_spec(name)
    del _REGISTRY[name]


def available_models() -> tuple[str, ...]:
    """Names of all registered models, in registration order."""
    return tuple(_REGISTRY)


def get_spec(name: str) -> ModelSpec:
    """The `ModelSpec` registered under ``name``, or of the user's own factory when ``name`` is
    ``MODULE:FACTORY`` (`from_factory`); unknown names raise ``ValueError``."""
    spec = _REGISTRY.get(name) if isinstance(name, str) else None
    if spec is None and isinstance(name, str) and ":" in name:
        spec = from_factory(name)
    if spec is None:
        raise ValueError(
            f"unknown model {name!r}; known models: {', '.join(available_models())}, or "
            f"MODULE:FACTORY (a function of yours: FACTORY(input_shape, num_classes) -> "
            f"nn.Module)"
        )
    return spec


def from_factory(name: str) -> ModelSpec:
    """Register the user's own model, ``MODULE:FACTORY``: ``FACTORY(input_shape,
    num_classes) -> nn.Module`` in a module on the Python path or in the current folder
    (every process of a run imports it, as it imports `--plugin` modules). It reads images,
    (C, H, W), unless the factory says ``FACTORY.inputs = "tokens"`` (then ``(context,)``,
    the vocabulary, and the size options as keywords). ``ValueError`` naming the module or
    the factory when either is missing."""
    import importlib
    import os
    import sys

    module, _, attr = name.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())  # (as `python -m` has it; the `hetsync` script has not)
    try:
        found = importlib.import_module(module)
    except Exception as err:  # noqa: BLE001 - the user's module: say what it raised
        raise ValueError(f"model {name!r}: cannot import module {module!r} ({type(err).__name__}: "
                         f"{err}); expected MODULE:FACTORY with MODULE on the Python path"
                         ) from None
    factory = getattr(found, attr, None)
    if not callable(factory):
        raise ValueError(f"model {name!r}: module {module!r} has no function {attr!r}; expected "
                         f"FACTORY(input_shape, num_classes) -> nn.Module")
    register(name, inputs=getattr(factory, "inputs", "image"))(factory)
    return _REGISTRY[name]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_input_shape(input_shape: Sequence[int], min_size: int = 1) -> InputShape:
    """Check ``input_shape`` is (C, H, W) with 1 <= C <= 4 and H, W >= ``min_size``.

    Returns it as a plain tuple of ints; raises ``ValueError`` naming the shape otherwise.
    """
    try:
        shape = tuple(input_shape)
    except TypeError:
        raise ValueError(f"input_shape must be (C, H, W), got {input_shape!r}") from None
    if len(shape) != 3 or not all(_is_int(v) for v in shape):
        raise ValueError(f"input_shape must be three ints (C, H, W), got {input_shape!r}")
    c, h, w = shape
    if not 1 <= c <= MAX_CHANNELS:
        raise ValueError(
            f"input_shape {shape!r}: channels C={c} must be between 1 and {MAX_CHANNELS}"
        )
    if h < min_size or w < min_size:
        raise ValueError(
            f"input_shape {shape!r}: height and width must be at least {min_size}"
        )
    return (c, h, w)


def build_model(name: str, input_shape: Sequence[int], num_classes: int = 10,
                **options) -> nn.Module:
    """Build the registered model ``name`` for inputs of ``input_shape``: (C, H, W) for an image
    model, (context,) for a token model (``num_classes`` then is the vocabulary's size, and
    ``options`` its size, e.g. ``n_layer=4``).

    The model maps a batch to logits, ``(N, num_classes)`` for images and
    ``(N, num_classes, T)`` for tokens, and is returned in training mode. Its initial weights
    depend only on torch's global RNG, so ``torch.manual_seed(s)`` before the call makes the
    build reproducible.

    Raises ``ValueError`` for an unknown ``name`` (listing the known ones), an invalid
    ``input_shape`` (C outside 1..4, H or W below the model's minimum; a context below 1),
    ``num_classes < 2``, or options an image model does not take.
    """
    spec = get_spec(name)
    if not _is_int(num_classes) or num_classes < 2:
        raise ValueError(f"num_classes must be an int >= 2, got {num_classes!r}")
    if spec.inputs == "tokens":
        shape = tuple(input_shape)
        if len(shape) != 1 or not _is_int(shape[0]) or shape[0] < 1:
            raise ValueError(f"model {name!r} reads token sequences: input_shape must be "
                             f"(context,) with context >= 1, got {input_shape!r}")
        return spec.builder(shape, num_classes, **options)
    if options:
        raise ValueError(f"model {name!r} takes no options, got {', '.join(options)}")
    model = spec.builder(validate_input_shape(input_shape, spec.min_size), num_classes)
    if not isinstance(model, nn.Module):
        raise ValueError(f"model {name!r}: its builder returned {type(model).__name__}, not a "
                         f"torch.nn.Module")
    return model


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of scalar parameters of ``model`` (buffers such as BN running stats excluded)."""
    return sum(
        p.numel() for p in model.parameters() if p.requires_grad or not trainable_only
    )
