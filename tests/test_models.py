"""Tests for hetsync.models: registry, validation, shapes, one SGD step, learning, BN buffers."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from hetsync.models import (
    MODEL_NAMES,
    build_model,
    count_parameters,
    get_spec,
    register,
    unregister,
)
from hetsync.models.inception import InceptionV3

SHAPES = [(1, 28, 28), (3, 32, 32)]
LIGHT = ["mlp", "lenet", "alexnet", "resnet18-v1"]
HEAVY = ["resnet50-v1", "resnet50-v2", "mobilenet-v1", "mobilenet-v2", "inception-v3"]
BN_MODELS = ["resnet18-v1", "resnet50-v1", "resnet50-v2", "mobilenet-v1", "mobilenet-v2", "inception-v3"]


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _sgd_step(name: str, shape: tuple[int, int, int], batch: int = 2, num_classes: int = 10) -> None:
    """Build, check the output shape, take one SGD step and check it moved the weights."""
    torch.manual_seed(0)
    model = build_model(name, shape, num_classes=num_classes)
    x = torch.rand(batch, *shape)
    y = torch.arange(batch) % num_classes
    before = [p.detach().clone() for p in model.parameters()]
    out = model(x)
    assert out.shape == (batch, num_classes), (name, shape, out.shape)
    loss = F.cross_entropy(out, y)
    assert torch.isfinite(loss), (name, shape, loss)
    loss.backward()
    params = list(model.parameters())
    assert all(p.grad is not None for p in params), f"{name}: a parameter takes no part in forward"
    assert all(torch.isfinite(p.grad).all() for p in params), name
    torch.optim.SGD(params, lr=0.01).step()
    changed = [not torch.equal(b, p.detach()) for b, p in zip(before, params)]
    assert sum(changed) >= 0.9 * len(params), f"{name}: only {sum(changed)}/{len(params)} tensors moved"


def test_model_names():
    assert MODEL_NAMES == (
        "mlp", "lenet", "alexnet", "resnet18-v1", "resnet50-v1", "resnet50-v2",
        "mobilenet-v1", "mobilenet-v2", "inception-v3", "gpt-char",
    )


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", LIGHT)
def test_light_models_build_and_step(name, shape):
    _sgd_step(name, shape, num_classes=10)


def test_heavy_models_build_and_step():
    for name in HEAVY:
        for shape in SHAPES:
            _sgd_step(name, shape)


def test_other_class_counts_and_non_square_input():
    _sgd_step("lenet", (1, 28, 28), batch=3, num_classes=2)
    _sgd_step("resnet18-v1", (4, 16, 24), num_classes=7)
    _sgd_step("alexnet", (2, 20, 36), num_classes=100)


def test_every_model_runs_at_its_minimum_size():
    for name in (n for n in MODEL_NAMES if get_spec(n).inputs == "image"):
        size = get_spec(name).min_size
        torch.manual_seed(0)
        model = build_model(name, (2, size, size), num_classes=3)
        assert model(torch.rand(2, 2, size, size)).shape == (2, 3), name
        with torch.no_grad():
            assert model.eval()(torch.rand(1, 2, size, size)).shape == (1, 3), name
        with pytest.raises(ValueError):
            build_model(name, (2, size - 1, size)) if size > 1 else build_model(name, (2, 0, 1))


@pytest.mark.parametrize("name", ["mlp", "lenet"])
def test_small_models_overfit_a_fixed_batch(name):
    # 20 standardised (zero-mean, like normalised images) noise images, 2 per class.
    torch.manual_seed(0)
    model = build_model(name, (1, 28, 28))
    x = torch.randn(20, 1, 28, 28)
    y = torch.arange(20) % 10
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    losses = []
    for _ in range(40):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0], losses


def test_deterministic_given_seed():
    for name in ("lenet", "mobilenet-v2"):
        torch.manual_seed(123)
        a = build_model(name, (1, 28, 28))
        torch.manual_seed(123)
        b = build_model(name, (1, 28, 28))
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys()
        assert all(torch.equal(sa[k], sb[k]) for k in sa), name
        x = torch.rand(2, 1, 28, 28)
        assert torch.equal(a.eval()(x), b.eval()(x))


def test_parameter_counts_match_reference_architectures():
    # Reference counts for 3x32x32 input, 10 classes (CIFAR ResNet/MobileNet-v1 and
    # torchvision's MobileNet-v2 / Inception3 without aux head, re-headed to 10 classes).
    assert count_parameters(build_model("mlp", (1, 28, 28))) == 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10
    assert count_parameters(build_model("lenet", (1, 28, 28))) == 61_706  # classic LeNet-5
    assert count_parameters(build_model("resnet18-v1", (3, 32, 32))) == 11_173_962
    assert count_parameters(build_model("resnet50-v1", (3, 32, 32))) == 23_520_842
    assert count_parameters(build_model("mobilenet-v1", (3, 32, 32))) == 3_217_226
    assert count_parameters(build_model("mobilenet-v2", (3, 32, 32))) == 2_236_682
    assert count_parameters(InceptionV3((3, 32, 32), 10, width=1.0)) == 21_806_058


def test_count_parameters_trainable_only():
    model = build_model("mlp", (1, 28, 28))
    total = count_parameters(model)
    model.net[1].weight.requires_grad_(False)
    assert count_parameters(model, trainable_only=True) == total - 784 * 256
    assert count_parameters(model) == total


@pytest.mark.parametrize("name", BN_MODELS)
def test_batchnorm_models_have_running_stats(name):
    torch.manual_seed(0)
    model = build_model(name, (1, 28, 28))
    buffers = dict(model.named_buffers())
    means = [k for k in buffers if k.endswith("running_mean")]
    assert means, f"{name} has no BatchNorm running_mean buffers"
    assert any(k.endswith("running_var") for k in buffers)
    before = {k: buffers[k].clone() for k in means}
    with torch.no_grad():
        model.train()(torch.rand(2, 1, 28, 28))
    assert all(not torch.equal(before[k], buffers[k]) for k in means), "running stats not updated"


def test_unknown_name_raises_naming_it_and_the_known_ones():
    with pytest.raises(ValueError) as err:
        build_model("resnet19", (1, 28, 28))
    assert "resnet19" in str(err.value)
    assert all(name in str(err.value) for name in MODEL_NAMES)
    with pytest.raises(ValueError, match="None"):
        build_model(None, (1, 28, 28))


@pytest.mark.parametrize(
    "name, shape",
    [
        ("resnet18-v1", (1, 8, 8)),
        ("inception-v3", (3, 15, 32)),
        ("mobilenet-v1", (3, 32, 12)),
        ("lenet", (1, 11, 11)),
        ("mlp", (5, 28, 28)),
        ("lenet", (0, 28, 28)),
        ("alexnet", (1, 28)),
        ("mlp", (1, 28, 28, 1)),
        ("mlp", (1, 28.0, 28)),
        ("mlp", (1, -28, 28)),
        ("mlp", 28),
    ],
)
def test_bad_shapes_raise_naming_the_shape(name, shape):
    with pytest.raises(ValueError) as err:
        build_model(name, shape)
    assert str(tuple(shape) if isinstance(shape, tuple) else shape) in str(err.value)


@pytest.mark.parametrize("num_classes", [1, 0, -3, 2.5, True])
def test_bad_num_classes_raise(num_classes):
    with pytest.raises(ValueError) as err:
        build_model("mlp", (1, 28, 28), num_classes=num_classes)
    assert repr(num_classes) in str(err.value)


def test_shape_given_as_list_or_size_is_accepted():
    assert build_model("mlp", [1, 28, 28])(torch.rand(2, 1, 28, 28)).shape == (2, 10)
    assert build_model("mlp", torch.Size([1, 28, 28]))(torch.rand(2, 1, 28, 28)).shape == (2, 10)


def test_registering_a_new_family():
    @register("tiny-test-net", min_size=4)
    def tiny(input_shape, num_classes):
        c, h, w = input_shape
        return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, num_classes))

    try:
        model = build_model("tiny-test-net", (2, 4, 4), num_classes=3)
        assert model(torch.rand(5, 2, 4, 4)).shape == (5, 3)
        with pytest.raises(ValueError, match=r"\(2, 3, 4\)"):
            build_model("tiny-test-net", (2, 3, 4))
        with pytest.raises(ValueError, match="tiny-test-net"):
            register("tiny-test-net")(tiny)
    finally:
        unregister("tiny-test-net")
    with pytest.raises(ValueError, match="tiny-test-net"):
        build_model("tiny-test-net", (2, 4, 4))
