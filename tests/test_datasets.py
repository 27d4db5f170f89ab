"""Data sets: ArrayDataset batches, Fashion-MNIST search and validation, CIFAR-10 with the
restricted unpickler, the synthetic set, and load_dataset's dispatch."""

from __future__ import annotations

import os
import pickle
import time

import numpy as np
import pytest
import torch

import hetsync.data.locate as locate
from hetsync.data import (
    DATASETS,
    ArrayDataset,
    DataFormatError,
    DataNotFoundError,
    DataSplit,
    IdxFormatError,
    UnsafePickleError,
    load_dataset,
    write_idx,
)
from hetsync.data.safe_pickle import safe_load

FMNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
DEBIAN_FMNIST = "/usr/share/datasets/fashion-mnist"


@pytest.fixture(autouse=True)
def isolated_search(monkeypatch, tmp_path):
    """No $HETSYNC_DATA and no system folder unless a test sets them, so results do not
    depend on this machine."""
    monkeypatch.delenv(locate.ENV_VAR, raising=False)
    monkeypatch.setattr(
        locate, "SYSTEM_DIRS", {"fashion-mnist": (str(tmp_path / "system-fmnist"),), "cifar10": ()}
    )


# --------------------------------------------------------------------------- ArrayDataset


def small_dataset(n=10, c=3, mean=(0.5, 0.25, 0.0), std=(0.5, 0.25, 1.0)):
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, c, 4, 4), dtype=torch.uint8, generator=g)
    return ArrayDataset(images, torch.arange(n, dtype=torch.int64) % 10, mean, std)


@pytest.mark.parametrize("kind", ["numpy", "tensor", "list"])
def test_batch_normalises_per_channel_and_keeps_order(kind):
    ds = small_dataset()
    raw = [7, 2, 2, 0]
    idx = {"numpy": np.array(raw), "tensor": torch.tensor(raw, dtype=torch.int32), "list": raw}[kind]
    x, y = ds.batch(idx)
    assert x.dtype == torch.float32 and x.shape == (4, 3, 4, 4)
    assert y.dtype == torch.int64 and y.tolist() == [7, 2, 2, 0]
    mean = torch.tensor(ds.mean).view(1, 3, 1, 1)
    std = torch.tensor(ds.std).view(1, 3, 1, 1)
    expected = (ds.images[torch.tensor(raw)].float() / 255 - mean) / std
    torch.testing.assert_close(x, expected)


def test_batch_does_not_alias_the_stored_images():
    ds = small_dataset()
    before = ds.images.clone()
    x, _ = ds.batch(np.arange(3))
    x.zero_()
    assert torch.equal(ds.images, before)
    assert len(ds) == 10 and ds.shape == (3, 4, 4)


def test_batch_rejects_out_of_range_and_2d():
    ds = small_dataset()
    with pytest.raises(IndexError):
        ds.batch(np.array([10]))
    with pytest.raises(ValueError, match="1-D"):
        ds.batch(np.zeros((2, 2), dtype=np.int64))


def test_array_dataset_validates():
    im = torch.zeros(4, 1, 2, 2, dtype=torch.uint8)
    lb = torch.zeros(4, dtype=torch.int64)
    with pytest.raises(ValueError, match="uint8"):
        ArrayDataset(im.float(), lb, (0.0,), (1.0,))
    with pytest.raises(ValueError, match="int64"):
        ArrayDataset(im, lb.int(), (0.0,), (1.0,))
    with pytest.raises(ValueError, match="4 images but 3 labels"):
        ArrayDataset(im, lb[:3], (0.0,), (1.0,))
    with pytest.raises(ValueError, match="1 channels"):
        ArrayDataset(im, lb, (0.0, 0.0), (1.0, 1.0))
    with pytest.raises(ValueError, match="positive"):
        ArrayDataset(im, lb, (0.0,), (0.0,))


# --------------------------------------------------------------------------- Fashion-MNIST


def write_fmnist(folder, n_train=12, n_test=6, gz=True, seed=0, **override):
    """Write four small Fashion-MNIST-format files; ``override`` replaces any array by role."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": (np.arange(n_train) % 10).astype(np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": (np.arange(n_test) % 10).astype(np.uint8),
    }
    arrays.update({k.replace("_", "-"): v for k, v in override.items()})
    for base, arr in arrays.items():
        write_idx(os.path.join(folder, base + (".gz" if gz else "")), arr)
    return arrays


def test_fmnist_dd_layout_with_subfolder_first(tmp_path):
    dd = tmp_path / "dd"
    write_fmnist(dd / "fashion-mnist", n_train=12)
    write_fmnist(dd, n_train=20)  # flat files too: the sub-folder wins (ESync's -dd layout)
    split = load_dataset("fashion-mnist", str(dd))
    assert isinstance(split, DataSplit)
    assert (len(split.train), len(split.test)) == (12, 6)
    assert split.name == "fashion-mnist" and split.input_shape == (1, 28, 28) and split.num_classes == 10
    assert split.train.images.shape == (12, 1, 28, 28) and split.train.images.dtype == torch.uint8
    assert split.train.labels.dtype == torch.int64
    assert split.train.mean == (0.2860,) and split.train.std == (0.3530,)


def test_fmnist_content_round_trips(tmp_path):
    arrays = write_fmnist(tmp_path / "fashion-mnist", gz=False)  # raw files are accepted too
    split = load_dataset("fashion-mnist", tmp_path)
    np.testing.assert_array_equal(split.train.images[:, 0].numpy(), arrays["train-images-idx3-ubyte"])
    np.testing.assert_array_equal(split.test.labels.numpy(), arrays["t10k-labels-idx1-ubyte"])


def test_fmnist_flat_dir(tmp_path):
    write_fmnist(tmp_path / "flat", n_train=14)
    assert len(load_dataset("fashion-mnist", tmp_path / "flat").train) == 14


@pytest.mark.parametrize("sub", [True, False], ids=["env-subfolder", "env-flat"])
def test_fmnist_from_env(tmp_path, monkeypatch, sub):
    root = tmp_path / "env"
    write_fmnist(root / "fashion-mnist" if sub else root, n_train=16)
    monkeypatch.setenv("HETSYNC_DATA", str(root))
    assert len(load_dataset("fashion-mnist").train) == 16


def test_fmnist_given_dir_without_data_is_refused_not_passed_over(tmp_path, monkeypatch):
    """A named -dd is the only place searched: an incomplete copy there must not silently
    give way to another copy in $HETSYNC_DATA or the system folder."""
    write_fmnist(tmp_path / "dd" / "fashion-mnist")
    os.remove(tmp_path / "dd" / "fashion-mnist" / "t10k-labels-idx1-ubyte.gz")
    write_fmnist(tmp_path / "env" / "fashion-mnist", n_train=18)
    write_fmnist(tmp_path / "system-fmnist", n_train=22)
    monkeypatch.setenv("HETSYNC_DATA", str(tmp_path / "env"))
    with pytest.raises(DataNotFoundError) as info:
        load_dataset("fashion-mnist", tmp_path / "dd")
    msg = str(info.value)
    assert f"{tmp_path / 'dd' / 'fashion-mnist'} (missing t10k-labels-idx1-ubyte(.gz))" in msg
    assert str(tmp_path / "env") not in msg and "system-fmnist" not in msg and "\n" not in msg


def test_fmnist_system_dir_last(tmp_path):
    write_fmnist(tmp_path / "system-fmnist", n_train=22)  # the patched system folder
    assert len(load_dataset("fashion-mnist").train) == 22


def test_fmnist_missing_data_dir_is_named(tmp_path):
    missing = tmp_path / "no-such-dir"
    with pytest.raises(DataNotFoundError, match="no-such-dir"):
        load_dataset("fashion-mnist", missing)


def test_fmnist_not_found_lists_every_place_on_one_line(tmp_path, monkeypatch):
    env = tmp_path / "envroot"
    monkeypatch.setenv("HETSYNC_DATA", str(env))
    with pytest.raises(DataNotFoundError) as info:
        load_dataset("fashion-mnist")
    msg = str(info.value)
    places = [env / "fashion-mnist", env, tmp_path / "system-fmnist"]
    positions = [msg.index(f"{p} (does not exist)") for p in places]
    assert positions == sorted(positions), msg  # listed in search order
    assert "apt-get install dataset-fashion-mnist" in msg
    assert "-dd DIR" in msg and "train-images-idx3-ubyte.gz" in msg and "\n" not in msg
    assert isinstance(info.value, FileNotFoundError)


def test_fmnist_partial_folder_names_missing_file(tmp_path):
    write_fmnist(tmp_path)
    os.remove(tmp_path / "t10k-labels-idx1-ubyte.gz")
    with pytest.raises(DataNotFoundError, match=r"missing t10k-labels-idx1-ubyte\(\.gz\)"):
        load_dataset("fashion-mnist", tmp_path)


def test_fmnist_count_mismatch_names_both_files(tmp_path):
    write_fmnist(tmp_path, n_train=12, train_labels_idx1_ubyte=np.zeros(11, np.uint8))
    with pytest.raises(IdxFormatError) as info:
        load_dataset("fashion-mnist", tmp_path)
    msg = str(info.value)
    assert "train-images-idx3-ubyte.gz" in msg and "train-labels-idx1-ubyte.gz" in msg
    assert "12 images" in msg and "11 labels" in msg


def test_fmnist_wrong_image_shape(tmp_path):
    write_fmnist(tmp_path, t10k_images_idx3_ubyte=np.zeros((6, 28, 27), np.uint8))
    with pytest.raises(IdxFormatError, match=r"t10k-images-idx3-ubyte\.gz.*28×28.*\(6, 28, 27\)"):
        load_dataset("fashion-mnist", tmp_path)


def test_fmnist_label_out_of_range(tmp_path):
    write_fmnist(tmp_path, t10k_labels_idx1_ubyte=np.array([0, 1, 2, 3, 4, 10], np.uint8))
    with pytest.raises(IdxFormatError, match=r"t10k-labels-idx1-ubyte\.gz.*< 10.*found 10"):
        load_dataset("fashion-mnist", tmp_path)


def test_fmnist_corrupt_file_propagates(tmp_path):
    write_fmnist(tmp_path)
    p = tmp_path / "train-images-idx3-ubyte.gz"
    p.write_bytes(p.read_bytes()[:-20])
    with pytest.raises(IdxFormatError, match="train-images-idx3-ubyte.gz"):
        load_dataset("fashion-mnist", tmp_path)


@pytest.mark.skipif(not os.path.isdir(DEBIAN_FMNIST), reason=f"{DEBIAN_FMNIST} absent (apt-get install dataset-fashion-mnist)")
def test_real_fashion_mnist(monkeypatch):
    monkeypatch.setattr(locate, "SYSTEM_DIRS", {"fashion-mnist": (DEBIAN_FMNIST,), "cifar10": ()})
    t0 = time.perf_counter()
    split = load_dataset("fashion-mnist")
    elapsed = time.perf_counter() - t0
    assert (len(split.train), len(split.test)) == (60000, 10000)
    assert split.num_classes == 10 and split.input_shape == (1, 28, 28)
    assert torch.bincount(split.train.labels).tolist() == [6000] * 10
    assert torch.bincount(split.test.labels).tolist() == [1000] * 10
    x, _ = split.train.batch(np.arange(60000))
    assert abs(x.mean().item()) < 0.01 and abs(x.std().item() - 1) < 0.01  # the constants fit
    assert elapsed < 30, f"loading took {elapsed:.1f} s"


# --------------------------------------------------------------------------- CIFAR-10


def write_cifar(folder, per_batch=20, n_test=10, protocol=2, bytes_keys=True, seed=0):
    """A CIFAR-10 "python version" directory in miniature (same dict layout as the real one)."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    k = (lambda s: s.encode()) if bytes_keys else (lambda s: s)
    written = {}
    for name, n in [(f"data_batch_{i}", per_batch) for i in range(1, 6)] + [("test_batch", n_test)]:
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, n)]
        d = {k("batch_label"): k(f"{name} of 6"), k("labels"): labels, k("data"): data,
             k("filenames"): [k(f"img_{i}.png") for i in range(n)]}
        with open(os.path.join(folder, name), "wb") as f:
            pickle.dump(d, f, protocol=protocol)
        written[name] = (data, labels)
    return written


@pytest.mark.parametrize("protocol,bytes_keys", [(2, True), (4, False), (5, True)])
def test_cifar10_tiny_directory(tmp_path, protocol, bytes_keys):
    written = write_cifar(tmp_path / "cifar-10-batches-py", protocol=protocol, bytes_keys=bytes_keys)
    split = load_dataset("cifar10", tmp_path)
    assert split.name == "cifar10" and split.input_shape == (3, 32, 32) and split.num_classes == 10
    assert (len(split.train), len(split.test)) == (100, 10)
    assert split.train.images.dtype == torch.uint8 and split.train.images.shape == (100, 3, 32, 32)
    assert split.train.mean == (0.4914, 0.4822, 0.4465) and split.train.std == (0.2470, 0.2435, 0.2616)
    # Row layout: 1024 red, 1024 green, 1024 blue, each row-major 32×32; batches in order 1..5.
    data3, labels3 = written["data_batch_3"]
    img = split.train.images[40 + 5].numpy()
    assert img[1, 2, 7] == data3[5, 1024 + 2 * 32 + 7]
    np.testing.assert_array_equal(img.reshape(-1), data3[5])
    assert split.train.labels[40:60].tolist() == labels3
    np.testing.assert_array_equal(split.test.images.numpy().reshape(10, -1), written["test_batch"][0])


def test_cifar10_flat_dir_and_env(tmp_path, monkeypatch):
    write_cifar(tmp_path / "flat", per_batch=4)
    assert len(load_dataset("cifar10", tmp_path / "flat").train) == 20
    write_cifar(tmp_path / "env" / "cifar-10-batches-py", per_batch=6)
    monkeypatch.setenv("HETSYNC_DATA", str(tmp_path / "env"))
    assert len(load_dataset("cifar10").train) == 30


def test_cifar10_not_found_lists_places(tmp_path, monkeypatch):
    monkeypatch.setenv("HETSYNC_DATA", str(tmp_path / "env"))
    (tmp_path / "dd").mkdir()
    with pytest.raises(DataNotFoundError) as info:
        load_dataset("cifar10", tmp_path / "dd")
    msg = str(info.value)
    for p in [tmp_path / "dd" / "cifar-10-batches-py", tmp_path / "dd"]:
        assert f"{p} (" in msg, msg
    assert str(tmp_path / "env") not in msg  # a given -dd is the only place searched
    assert "data_batch_1" in msg and "-dd DIR" in msg
    with pytest.raises(DataNotFoundError) as info:
        load_dataset("cifar10")
    assert f"{tmp_path / 'env' / 'cifar-10-batches-py'} (does not exist)" in str(info.value)


class _Evil:
    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


def test_restricted_unpickler_refuses_os_system(tmp_path):
    target = tmp_path / "pwned"
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar(folder)
    with open(folder / "data_batch_2", "wb") as f:
        pickle.dump({b"data": _Evil(target), b"labels": []}, f, protocol=2)
    with pytest.raises(UnsafePickleError) as info:
        load_dataset("cifar10", tmp_path)
    msg = str(info.value)
    assert "data_batch_2" in msg and "system" in msg and "refusing" in msg
    assert not target.exists()
    assert isinstance(info.value, pickle.UnpicklingError)


@pytest.mark.parametrize("module,name", [("builtins", "eval"), ("builtins", "getattr"), ("subprocess", "Popen"), ("numpy", "load")])
def test_restricted_unpickler_refuses_other_globals(tmp_path, module, name):
    path = tmp_path / "p"
    path.write_bytes(b"\x80\x02c" + f"{module}\n{name}\n".encode() + b"q\x00.")
    with pytest.raises(UnsafePickleError, match=f"{module}.{name}"):
        safe_load(path)


def test_cifar10_malformed_batches(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar(folder)
    with open(folder / "test_batch", "wb") as f:
        pickle.dump({b"data": np.zeros((3, 3072), np.float32), b"labels": [0, 1, 2]}, f)
    with pytest.raises(DataFormatError, match=r"test_batch.*uint8.*float32"):
        load_dataset("cifar10", tmp_path)
    with open(folder / "test_batch", "wb") as f:
        pickle.dump({b"data": np.zeros((3, 3072), np.uint8), b"labels": [0, 1]}, f)
    with pytest.raises(DataFormatError, match=r"test_batch.*3 images"):
        load_dataset("cifar10", tmp_path)
    with open(folder / "test_batch", "wb") as f:
        pickle.dump({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}, f)
    with pytest.raises(DataFormatError, match=r"test_batch.*0\.\.9"):
        load_dataset("cifar10", tmp_path)
    (folder / "test_batch").write_bytes(pickle.dumps({b"data": 1})[:-3])
    with pytest.raises(DataFormatError, match=r"test_batch.*not a valid pickle"):
        load_dataset("cifar10", tmp_path)


# --------------------------------------------------------------------------- synthetic


def test_synthetic_shape_balance_and_determinism():
    a = load_dataset("synthetic", seed=3, synthetic_size=(600, 200))
    b = load_dataset("synthetic", seed=3, synthetic_size=(600, 200))
    c = load_dataset("synthetic", seed=4, synthetic_size=(600, 200))
    assert (len(a.train), len(a.test)) == (600, 200)
    assert a.input_shape == (1, 28, 28) and a.num_classes == 10 and a.name == "synthetic"
    assert torch.bincount(a.train.labels).tolist() == [60] * 10
    assert torch.bincount(a.test.labels).tolist() == [20] * 10
    assert torch.equal(a.train.images, b.train.images) and torch.equal(a.test.labels, b.test.labels)
    assert not torch.equal(a.train.images, c.train.images)
    x, _ = a.train.batch(np.arange(600))  # mean/std computed from the training set
    assert abs(x.mean().item()) < 1e-3 and abs(x.std().item() - 1) < 1e-2


def test_synthetic_colour_shape():
    s = load_dataset("synthetic", synthetic_shape=(3, 32, 32), synthetic_size=(100, 50))
    assert s.train.images.shape == (100, 3, 32, 32) and s.input_shape == (3, 32, 32)
    assert len(s.train.mean) == 3 and len(s.train.std) == 3


def test_synthetic_bad_arguments():
    with pytest.raises(ValueError, match="synthetic_shape"):
        load_dataset("synthetic", synthetic_shape=(28, 28))
    with pytest.raises(ValueError, match="synthetic_size"):
        load_dataset("synthetic", synthetic_size=(0, 10))


@pytest.fixture
def one_thread():
    """Tiny matmuls are far slower with threads fighting over a shared, busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_synthetic_is_learnable_by_a_small_mlp(one_thread):
    torch.manual_seed(0)
    split = load_dataset("synthetic", seed=0, synthetic_size=(3000, 1000))
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    rng = np.random.default_rng(0)
    for _ in range(300):
        x, y = split.train.batch(rng.integers(0, len(split.train), 64))
        loss = torch.nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        x, y = split.test.batch(np.arange(len(split.test)))
        acc = (net(x).argmax(1) == y).float().mean().item()
    assert 0.6 < acc < 1.0, acc  # far above chance (0.1), not trivially perfect


# --------------------------------------------------------------------------- dispatch


def test_unknown_dataset_lists_known():
    assert DATASETS == ("fashion-mnist", "cifar10", "shakespeare", "synthetic")
    with pytest.raises(ValueError) as info:
        load_dataset("mnist")
    msg = str(info.value)
    assert "'mnist'" in msg and all(n in msg for n in DATASETS)
