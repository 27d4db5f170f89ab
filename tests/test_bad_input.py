"""Bad input, one line each (issue 17): every flag of every subcommand given an invalid value,
and every corrupt data file or directory, ends the command with a non-zero exit and one line
on stderr that names the bad value — never a traceback, never a silent acceptance.

The corpus runs `hetsync.cli.main` in this process (fast; nothing trains: anything that would
start a run, a server or a bench raises instead), and a few cases in a subprocess, as a user
types them (the one that segfaulted, and what launch used to relay from its workers)."""

from __future__ import annotations

import gzip
import os
import pickle
import socket
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hetsync.data.locate as locate
from hetsync.cli import main
from hetsync.data import write_idx

FMNIST = {"train-images-idx3-ubyte": (12, 28, 28), "train-labels-idx1-ubyte": (12,),
          "t10k-images-idx3-ubyte": (6, 28, 28), "t10k-labels-idx1-ubyte": (6,)}
CIFAR = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)
SRC = str(Path(__file__).resolve().parents[1] / "src")


# --------------------------------------------------------------------------- bad data on disk
def _fmnist(folder: Path, n_train: int = 12, skip=(), dirs=(), raw: dict | None = None) -> None:
    """A small Fashion-MNIST folder: `skip` leaves files out, `dirs` puts a directory where a
    file should be, `raw` writes given bytes instead of a file."""
    folder.mkdir(parents=True, exist_ok=True)
    for base, shape in FMNIST.items():
        path = folder / (base + ".gz")
        if base in skip:
            continue
        if base in dirs:
            path.mkdir()
        elif raw and base in raw:
            path.write_bytes(raw[base])
        else:
            n = n_train if base.startswith("train") else shape[0]
            images = base.endswith("images-idx3-ubyte")
            write_idx(path, np.zeros((n, 28, 28), np.uint8) if images
                      else (np.arange(n) % 10).astype(np.uint8))


def _cifar(folder: Path, per_batch: int = 4, replace: dict | None = None,
           protocol: int = 2) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in CIFAR:
        if replace and name in replace:
            value = replace[name]
            if value is None:
                (folder / name).mkdir()
            else:
                (folder / name).write_bytes(value)
            continue
        d = {b"data": np.zeros((per_batch, 3072), np.uint8), b"labels": [1] * per_batch}
        (folder / name).write_bytes(pickle.dumps(d, protocol=protocol))


class _HugeArray:  # an empty array that says it is 100 GB
    def __reduce__(self):
        from numpy._core.multiarray import _reconstruct  # what numpy's own pickles name

        return (_reconstruct, (np.ndarray, (100_000_000_000,), b"b"))


class _ObjectArray:  # an object array of a huge shape, filled by its state
    def __reduce__(self):
        from numpy._core.multiarray import _reconstruct

        return (_reconstruct, (np.ndarray, (0,), b"b"),
                (1, (100_000_000, 3072), np.dtype("O"), False, [1, 2]))


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bad-data")
    fm = "fashion-mnist"
    _fmnist(root / "no-test-labels" / fm, skip=("t10k-labels-idx1-ubyte",))
    _fmnist(root / "dirs-for-files" / fm, dirs=("train-labels-idx1-ubyte",))
    _fmnist(root / "empty-set" / fm, n_train=0)
    _fmnist(root / "one-image" / fm, n_train=1)
    _fmnist(root / "truncated" / fm, raw={"train-images-idx3-ubyte": b"\x1f\x8b\x08\x00"})
    _fmnist(root / "bad-magic" / fm, raw={"t10k-images-idx3-ubyte": _gz(b"\x01\x02\x08\x03" + b"\0" * 12)})
    _fmnist(root / "not-gzip" / fm, raw={"train-labels-idx1-ubyte": b"hello"})
    _fmnist(root / "labels-mismatch" / fm, raw={"train-labels-idx1-ubyte": _idx(np.zeros(5, np.uint8))})
    _fmnist(root / "label-11" / fm, raw={"t10k-labels-idx1-ubyte": _idx(np.full(6, 11, np.uint8))})
    bytes8 = b"\x80\x04\x8e" + struct.pack("<Q", 100 * 2**30) + b"xxxxxxxx."  # 20 bytes, 93 GiB
    assert len(bytes8) == 20
    cifar = "cifar-10-batches-py"
    _cifar(root / "cifar-20-bytes" / cifar, replace={"data_batch_1": bytes8})
    frame = b"\x80\x04\x95" + struct.pack("<Q", 100 * 2**30) + b"}."
    _cifar(root / "cifar-frame" / cifar, replace={"data_batch_2": frame})
    _cifar(root / "cifar-huge-shape" / cifar,
           replace={"data_batch_3": pickle.dumps({b"data": _HugeArray()}, protocol=2)})
    _cifar(root / "cifar-object-array" / cifar,
           replace={"test_batch": pickle.dumps({b"data": _ObjectArray()}, protocol=2)})
    _cifar(root / "cifar-dir-for-file" / cifar, replace={"test_batch": None})
    _cifar(root / "cifar-empty" / cifar, per_batch=0, protocol=4)
    _cifar(root / "cifar-huge-label" / cifar, replace={"data_batch_4": pickle.dumps(
        {b"data": np.zeros((1, 3072), np.uint8), b"labels": [10**30]}, protocol=2)})
    _cifar(root / "cifar-float-labels" / cifar, replace={"data_batch_5": pickle.dumps(
        {b"data": np.zeros((1, 3072), np.uint8), b"labels": [1.5]}, protocol=2)})
    (root / "a-file").write_text("not a directory\n")
    configs = {"not-json.json": '{"mode": "sync",', "unknown-key.json": '{"modee": "sync"}',
               "a-list.json": "[1, 2]", "wrong-type.json": '{"workers": "four"}',
               "bad-slowdowns.json": '{"slowdowns": "1,2"}', "bool-int.json": '{"seed": true}',
               "bad-option.json": '{"mode": "esync", "options": {"epsilon": "x"}}',
               "nan-timeout.json": '{"timeout": NaN}', "options-list.json": '{"options": []}',
               "binary.json": None}
    for name, text in configs.items():
        if text is None:
            (root / name).write_bytes(b"\xff\xfe\x00garbage")
        else:
            (root / name).write_text(text)
    return root


def _gz(raw: bytes) -> bytes:
    return gzip.compress(raw)


def _idx(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 8, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return _gz(header + array.tobytes())


# --------------------------------------------------------------------------- the corpus
L = ["launch", "--dataset", "synthetic"]
W = ["worker", "--dataset", "synthetic"]
S = ["state-server"]
B = ["bench", "--dataset", "synthetic"]
C = ["bench", "comm"]
TAKEN = "{taken_port}"

CASES = [
    # ---- launch: every common flag (the Config fields)
    (L + ["-m", "hogwild"], "-m/--mode: invalid value 'hogwild'"),
    (L + ["-n", "vgg99"], "-n/--network: invalid value 'vgg99'"),
    (["launch", "--dataset", "mnist"], "--dataset: invalid value 'mnist'"),
    (L + ["-dd", "/nonexistent/data"], "-dd/--data-dir: invalid value '/nonexistent/data'"),
    (L + ["-dd", "{data}/a-file"], "a-file'; expected an existing directory"),
    (L + ["-b", "0"], "-b/--batch-size: invalid value 0"),
    (L + ["-b", "-5"], "-b/--batch-size: invalid value -5"),
    (L + ["-b", "abc"], "invalid int value: 'abc'"),
    (L + ["-b", "1000000000"], "-b/--batch-size: invalid value 1000000000; expected at most"),
    (L + ["-l", "nan"], "-l/--learning-rate: invalid value nan"),
    (L + ["-l", "inf"], "-l/--learning-rate: invalid value inf"),
    (L + ["-l", "0"], "-l/--learning-rate: invalid value 0.0"),
    (L + ["-l", "-0.1"], "-l/--learning-rate: invalid value -0.1"),
    (L + ["--momentum", "1"], "--momentum: invalid value 1.0"),
    (L + ["--momentum", "nan"], "--momentum: invalid value nan"),
    (L + ["--optimizer", "adam"], "--optimizer: invalid value 'adam'; expected sgd or adamw"),
    (L + ["--optimizer", "adamw", "--momentum", "0.9"],
     "--momentum: invalid value 0.9; expected 0 with --optimizer adamw"),
    (L + ["--weight-decay", "-1"], "--weight-decay: invalid value -1.0"),
    (L + ["-m", "async", "--momentum", "0.9"], "applies plain SGD"),
    (L + ["-m", "dgc", "--optimizer", "adamw"], "mode 'dgc' applies SGD"),
    (L + ["--lr-schedule", "step"], "--lr-schedule: invalid value 'step'"),
    (L + ["--lr-final", "2"], "--lr-final: invalid value 2.0"),
    (L + ["--lr-final", "nan"], "--lr-final: invalid value nan"),
    (L + ["--time-budget", "none", "--epochs", "none", "--target-acc", "0.8"],
     "--lr-schedule: invalid value 'cosine'; expected constant without --time-budget"),
    (L + ["-g", "-2"], "-g/--gpu: invalid value -2"),
    (L + ["-g", "99"], "-g/--gpu 99"),
    (L + ["-c", "maybe"], "expected 0 or 1, got 'maybe'"),
    (L + ["-ld", "{data}/a-file"], "-ld/--log-dir: invalid value '{data}/a-file'"),
    (L + ["-ld", "/dev/null/runs"], "-ld/--log-dir: invalid value '/dev/null/runs'"),
    (L + ["--run-name", "../escape"], "--run-name: invalid value '../escape'"),
    (L + ["-e", "-1"], "-e/--eval-every: invalid value -1"),
    (L + ["--eval-interval", "nan"], "--eval-interval: invalid value nan"),
    (L + ["--eval-interval", "0"], "--eval-interval: invalid value 0.0"),
    (L + ["--eval-interval", "inf"], "--eval-interval: invalid value inf"),
    (L + ["--deferred-eval", "2"], "expected 0 or 1, got '2'"),
    (L + ["-s", "yes please"], "expected 0 or 1, got 'yes please'"),
    (L + ["--partition", "random"], "--partition: invalid value 'random'"),
    (L + ["--partition", "dirichlet", "--dirichlet-alpha", "0"], "--dirichlet-alpha: invalid value 0.0"),
    (L + ["--dirichlet-alpha", "nan"], "--dirichlet-alpha: invalid value nan"),
    (L + ["--dirichlet-alpha", "inf"], "--dirichlet-alpha: invalid value inf"),
    (L + ["-m", "esync-outer", "-ip", "no.such.host.invalid"],
     "-ip/--service-ip: invalid value 'no.such.host.invalid'"),
    (L + ["-m", "esync-outer", "-ip", "192.0.2.1"], "-ip/--service-ip: invalid value '192.0.2.1'"),
    (L + ["-port", "0"], "-port/--service-port: invalid value 0"),
    (L + ["-port", "70000"], "-port/--service-port: invalid value 70000"),
    (L + ["-port", "-1"], "-port/--service-port: invalid value -1"),
    (L + ["--workers", "0"], "--workers: invalid value 0"),
    (L + ["--workers", "100000", "--slowdowns", ""], "--workers: invalid value 100000"),
    (L + ["-m", "sync", "--workers", "1000", "--slowdowns", ""],
     "-b/--batch-size: invalid value 64; expected at most 6"),
    (L + ["--slowdowns", "1,x"], "got '1,x'"),
    (L + ["--slowdowns", "1,2,nan,4"], "--slowdowns: invalid value (1.0, 2.0, nan, 4.0)"),
    (L + ["--slowdowns", "1,2"], "--slowdowns: invalid value (1.0, 2.0)"),
    (L + ["--slowdowns", "1,0.5,1,1"], "--slowdowns: invalid value (1.0, 0.5, 1.0, 1.0)"),
    (L + ["--straggle-prob", "1.5"], "--straggle-prob: invalid value 1.5"),
    (L + ["--straggle-prob", "nan"], "--straggle-prob: invalid value nan"),
    (L + ["--straggle-prob", "-0.1"], "--straggle-prob: invalid value -0.1"),
    (L + ["--straggle-delay", "-1"], "got '-1'"),
    (L + ["--straggle-delay", "fast"], "got 'fast'"),
    (L + ["--straggle-delay", "nanx"], "got 'nanx'"),
    (L + ["--inject", "1"], "--inject: invalid value True"),
    (L + ["--inject-alpha", "0"], "--inject-alpha: invalid value 0.0"),
    (L + ["--inject-beta", "2"], "--inject-beta: invalid value 2.0"),
    (L + ["--inject-alpha", "nan"], "--inject-alpha: invalid value nan"),
    (L + ["--collective", "mesh"], "--collective: invalid value 'mesh'"),
    (L + ["--time-budget", "0"], "--time-budget: invalid value 0.0"),
    (L + ["--time-budget", "inf"], "--time-budget: invalid value inf"),
    (L + ["--time-budget", "nan"], "--time-budget: invalid value nan"),
    (L + ["--target-acc", "1.5"], "--target-acc: invalid value 1.5"),
    (L + ["--target-acc", "0"], "--target-acc: invalid value 0.0"),
    (L + ["--epochs", "0"], "--epochs: invalid value 0.0"),
    (L + ["--epochs", "inf"], "--epochs: invalid value inf"),
    (L + ["--epochs", "nan"], "--epochs: invalid value nan"),
    (L + ["--time-budget", "none"], "no stopping rule"),
    (L + ["--bandwidth", "fast"], "--bandwidth: invalid value 'fast'"),
    (L + ["--bandwidth", "0mbit"], "--bandwidth: invalid value '0mbit'"),
    (L + ["--seed", "-1"], "--seed: invalid value -1"),
    (L + ["--seed", "4294967296"], "--seed: invalid value 4294967296"),
    (L + ["--seed", "1.5"], "invalid int value: '1.5'"),
    (L + ["--threads", "0"], "--threads: invalid value 0"),
    (L + ["--threads", "100000"], "--threads: invalid value 100000"),
    (L + ["--timeout", "nan"], "--timeout: invalid value nan"),
    (L + ["--timeout", "inf"], "--timeout: invalid value inf"),
    (L + ["--timeout", "0"], "--timeout: invalid value 0.0"),
    (L + ["--timeout", "-5"], "--timeout: invalid value -5.0"),
    (L + ["--timeout", "1e300"], "--timeout: invalid value 1e+300"),
    (L + ["--regroup-grace", "0"], "--regroup-grace: invalid value 0.0; expected a finite"),
    (L + ["--regroup-grace", "inf"], "--regroup-grace: invalid value inf; expected a finite"),
    (L + ["--slowdowns", "1,2,4,1e300"], "--slowdowns: invalid value (1.0, 2.0, 4.0, 1e+300)"),
    (L + ["--straggle-prob", "0.1", "--straggle-delay", "1e300"], "--straggle-delay: invalid value '1e300'"),
    (L + ["--straggle-delay", "5000x"], "--straggle-delay: invalid value '5000x'"),
    (L + ["--plugin", "no_such_module_here"], "no_such_module_here"),
    (L + ["--no-such-flag", "1"], "unrecognized arguments: --no-such-flag"),
    # ---- launch: each mode's own options
    (L + ["-m", "esync", "-ll", "nan"], "-ll/--local-lr: invalid value nan"),
    (L + ["-m", "esync", "-gl", "inf"], "-gl/--global-lr: invalid value inf"),
    (L + ["-m", "esync-outer", "--outer-momentum", "1"], "--outer-momentum: invalid value 1.0"),
    (L + ["-m", "esync", "--weighting", "random"], "--weighting: invalid value 'random'"),
    (L + ["-m", "esync", "--drift-correction", "fedprox"],
     "--drift-correction: invalid value 'fedprox'"),
    (L + ["-m", "esync-outer", "--drift-correction", "scaffold"], "needs --overlap 0"),
    (L + ["-m", "diloco", "--inner-steps", "0"], "--inner-steps: invalid value 0"),
    (L + ["-m", "diloco", "-gl", "0"], "-gl/--global-lr: invalid value 0.0"),
    (L + ["-m", "async-local-sgd", "--momentum-every", "-1"], "--momentum-every: invalid value -1"),
    (L + ["-m", "fedbuff", "--buffer-size", "0"], "--buffer-size: invalid value 0"),
    (L + ["-m", "diloco", "--buffer-size", "2"], "--buffer-size: is an option of mode fedbuff"),
    (L + ["-m", "esync", "--epsilon", "5"], "--epsilon: invalid value 5.0"),
    (L + ["-m", "esync", "--epsilon", "nan"], "--epsilon: invalid value nan"),
    (L + ["-m", "esync", "--epsilon", "soon"], "got 'soon'"),
    (L + ["-m", "esync", "--overlap", "sometimes"], "got 'sometimes'"),
    (L + ["-m", "sync", "-ll", "0.1"], "-ll/--local-lr: is an option of modes esync"),
    (L + ["-m", "dcasgd", "--dcasgd-lambda", "nan"], "--dcasgd-lambda: invalid value nan"),
    (L + ["-m", "eager-solo", "--eager-sync-every", "-1"], "--eager-sync-every: invalid value -1"),
    (L + ["-m", "eager-solo", "--eager-divide", "all"], "--eager-divide: invalid value 'all'"),
    (L + ["-m", "selsync", "--selsync-window", "0"], "--selsync-window: invalid value 0"),
    (L + ["-m", "selsync", "--selsync-delta", "nan"], "--selsync-delta: invalid value nan"),
    (L + ["-m", "selsync", "--selsync-alpha", "1"], "--selsync-alpha: invalid value 1.0"),
    (L + ["-m", "dgc", "--density", "0"], "--density: invalid value 0.0"),
    (L + ["-m", "dgc", "--sparse-momentum", "nan"], "--sparse-momentum: invalid value nan"),
    (L + ["-m", "dgc", "--sparse-weight-decay", "inf"], "--sparse-weight-decay: invalid value inf"),
    (L + ["-m", "dgs", "--dgs-resync", "0"], "--dgs-resync: invalid value 0"),
    (L + ["-m", "dgc", "--dgc-warmup-epochs", "-1"], "--dgc-warmup-epochs: invalid value -1"),
    (L + ["-m", "dgc", "--dgc-clip", "0"], "--dgc-clip: invalid value 0.0"),
    (L + ["-m", "post-local-sgd", "--localsgd-period", "0"], "--localsgd-period: invalid value 0"),
    (L + ["-m", "post-local-sgd", "--localsgd-warmup", "-3"], "--localsgd-warmup: invalid value -3"),
    # ---- launch: bad data (checked before any process starts)
    (["launch", "-dd", "{data}/no-test-labels"], "(missing t10k-labels-idx1-ubyte(.gz))"),
    (["launch", "-dd", "{data}/dirs-for-files"], "train-labels-idx1-ubyte.gz is not a file"),
    (["launch", "-dd", "{data}/empty-set"], "train-images-idx3-ubyte.gz: holds 0 images"),
    (["launch", "-m", "sync", "-dd", "{data}/one-image", "-b", "1"], "--workers: invalid value 4; expected at most 1"),
    (["launch", "-dd", "{data}/truncated"], "train-images-idx3-ubyte.gz: corrupt gzip stream"),
    (["launch", "-dd", "{data}/bad-magic"], "t10k-images-idx3-ubyte.gz: bad IDX magic"),
    (["launch", "-dd", "{data}/labels-mismatch"], "has 12 images but"),
    (["launch", "-dd", "{data}/label-11"], "t10k-labels-idx1-ubyte.gz: labels must be < 10, found 11"),
    (["launch", "--dataset", "cifar10", "-dd", "{data}/cifar-20-bytes"],
     "data_batch_1: not a valid pickle (20 bytes): expected 107374182400 bytes"),
    (["launch", "--dataset", "cifar10", "-dd", "{data}/cifar-huge-shape"],
     "data_batch_3: an array of shape (100000000000,)"),
    # ---- worker
    (W + ["--timeout", "nan"], "--timeout: invalid value nan"),
    (W + ["--seed", "-1"], "--seed: invalid value -1"),
    (W + ["-m", "esync", "--epsilon", "5"], "--epsilon: invalid value 5.0"),
    (W + ["--epsilon", "0.1"], "--epsilon: is an option of modes esync, esync-outer, not of -m local"),
    (W + ["--eval-interval", "nan"], "--eval-interval: invalid value nan"),
    (W + ["-m", "diloco", "--workers", "3", "--join", "--run-dir", "r"],
     "--join: mode diloco cannot take in a worker while it runs"),
    (W + ["-m", "esync", "--workers", "3", "--collective", "ps", "--join",
          "--run-dir", "r"],
     "--join: mode esync cannot take in a worker while it runs"),
    (W + ["-m", "esync", "--workers", "3", "--join"], "--join: give --run-dir"),
    (W + ["-m", "esync", "--workers", "3", "--join", "--resume", "r"], "--join and --resume r: give one"),
    (W + ["--threads", "100000"], "--threads: invalid value 100000"),
    (W + ["-ld", "{data}/a-file"], "-ld/--log-dir: invalid value '{data}/a-file'"),
    (W + ["--run-dir", "{data}/a-file/run"], "--run-dir: invalid value '{data}/a-file/run'"),
    (W + ["-m", "sync", "--workers", "2"], "WORLD_SIZE=1 but this run needs 2 processes"),
    (W + ["-m", "esync", "-ip", "no.such.host.invalid"], "invalid value 'no.such.host.invalid'"),
    (W + ["-g", "99"], "-g/--gpu 99"),
    (W + ["--config", "{data}/not-json.json"], "not-json.json': not JSON"),
    (W + ["--config", "{data}/unknown-key.json"], "unknown config keys ['modee']"),
    (W + ["--config", "{data}/a-list.json"], "expected a JSON object of config keys, got list [1, 2]"),
    (W + ["--config", "{data}/wrong-type.json"], "--workers: invalid value 'four'; expected an integer"),
    (W + ["--config", "{data}/bad-slowdowns.json"], "--slowdowns: invalid value '1,2'"),
    (W + ["--config", "{data}/bool-int.json"], "--seed: invalid value True; expected an integer"),
    (W + ["--config", "{data}/bad-option.json"], "--epsilon: invalid value 'x'; expected a number or null"),
    (W + ["--config", "{data}/nan-timeout.json"], "--timeout: invalid value nan"),
    (W + ["--config", "{data}/options-list.json"], "'options' must be an object, got []"),
    (W + ["--config", "{data}/binary.json"], "binary.json': cannot be read"),
    (W + ["--config", "{data}/missing.json"], "missing.json': cannot be read: No such file"),
    (W + ["--config", "{data}"], "cannot be read: Is a directory"),
    (["worker", "-dd", "{data}/no-test-labels"], "(missing t10k-labels-idx1-ubyte(.gz))"),
    (["worker", "-dd", "{data}/dirs-for-files"], "train-labels-idx1-ubyte.gz is not a file"),
    (["worker", "-dd", "{data}/empty-set"], "train-images-idx3-ubyte.gz: holds 0 images"),
    (["worker", "-dd", "{data}/one-image"], "-b/--batch-size: invalid value 64; expected at most 1"),
    (["worker", "-dd", "{data}/not-gzip"], "train-labels-idx1-ubyte.gz: not a gzip stream"),
    (["worker", "--dataset", "cifar10", "-dd", "{data}/cifar-frame"], "data_batch_2: not a valid pickle"),
    (["worker", "--dataset", "cifar10", "-dd", "{data}/cifar-object-array"], "test_batch: refusing dtype object"),
    (["worker", "--dataset", "cifar10", "-dd", "{data}/cifar-dir-for-file"], "test_batch is not a file"),
    (["worker", "--dataset", "cifar10", "-dd", "{data}/cifar-empty"], "hold 0 images"),
    (["worker", "--dataset", "cifar10", "-dd", "{data}/cifar-huge-label"], "data_batch_4: 'labels' is not a list of integers"),
    (["worker", "--dataset", "cifar10", "-dd", "{data}/cifar-float-labels"], "data_batch_5: 'labels' is not a list of integers"),
    # ---- state-server
    (S + ["--workers", "0"], "argument --workers: invalid value 0"),
    (S + ["--workers", "-3"], "argument --workers: invalid value -3"),
    (S + ["--workers", "four"], "argument --workers: invalid value 'four'"),
    (S + ["--workers", "1000000000"], "argument --workers: invalid value 1000000000"),
    (S + ["--epsilon", "5"], "argument --epsilon: invalid value '5'"),
    (S + ["--epsilon", "nan"], "argument --epsilon: invalid value 'nan'"),
    (S + ["--epsilon", "soon"], "got 'soon'"),
    (S + ["--port", "-1"], "argument --port/-port: invalid value -1"),
    (S + ["--port", "70000"], "argument --port/-port: invalid value 70000"),
    (S + ["--port", "http"], "argument --port/-port: invalid value 'http'"),
    (S + ["--port", TAKEN], "--port: invalid value {taken_port}; cannot listen"),
    (S + ["--host", "no.such.host.invalid"], "--host: invalid value 'no.such.host.invalid'"),
    (S + ["--host", "192.0.2.1"], "--host: invalid value '192.0.2.1'"),
    (S + ["--instance", "a b"], "argument --instance: invalid value 'a b'"),
    # ---- summarize, plot
    (["summarize", "x", "--targets", "nan"], "argument --targets: invalid value 'nan'"),
    (["summarize", "x", "--targets", "0.8", "inf"], "argument --targets: invalid value 'inf'"),
    (["summarize", "x", "--targets", "0"], "argument --targets: invalid value '0'"),
    (["summarize", "/nonexistent/run"], "run directory /nonexistent/run does not exist"),
    (["summarize", "{data}/empty-set"], "run directory {data}/empty-set has no run.json"),
    (["summarize"], "the following arguments are required: RUN_DIR"),
    (["plot", "x", "-o", "out", "--target", "nan"], "argument --target: invalid value 'nan'"),
    (["plot", "x", "-o", "out", "--target", "-2"], "argument --target: invalid value '-2'"),
    (["plot", "x", "-o", "{data}/a-file"], "-o/--output: invalid value '{data}/a-file'"),
    (["plot", "/nonexistent/run", "-o", "out"], "run directory /nonexistent/run does not exist"),
    (["plot", "x"], "the following arguments are required: -o/--output"),
    # ---- bench (the modes bench)
    (B + ["--workers", "0"], "--workers: invalid value 0; expected an integer in 1..1024"),
    (B + ["--modes", "hogwild"], "unknown 'hogwild'"),
    (B + ["--baselines", "horovod"], "unknown 'horovod'"),
    (B + ["--modes", "", "--baselines", "", "--reference", ""], "nothing to run"),
    (B + ["--modes", "sync,sync"], "'sync,sync' names a run twice"),
    (B + ["--slowdowns", "1,2"], "--slowdowns: invalid value (1.0, 2.0); expected 4 comma-"),
    (B + ["--slowdowns", "1,nan,1,1"], "invalid value (1.0, nan, 1.0, 1.0); expected factors"),
    (B + ["--targets", "0.5,1.5"], "--targets/--speedup-at: invalid target 1.5; expected an "
                                   "accuracy in (0, 1] (synthetic is judged by its test "
                                   "accuracy)"),
    (B + ["--speedup-at", "0"], "got '0'"),
    (B + ["-l", "nan"], "-l/--learning-rate: invalid value nan"),
    (B + ["--lr-sweep", "0.1,inf"], "got '0.1,inf'"),
    (B + ["--sweep-budget", "inf"], "got 'inf'"),
    (B + ["--seed", "-1"], "--seed: invalid value -1"),
    (B + ["--seed", "4294967295", "--repeats", "2"], "seeds 4294967295..4294967296"),
    (B + ["--repeats", "0"], "got '0'"),
    (B + ["--threads", "100000"], "--threads: invalid value 100000"),
    (B + ["--timeout", "inf"], "--timeout: invalid value inf"),
    (B + ["--eval-interval", "nan"], "--eval-interval: invalid value nan"),
    (B + ["-n", "vgg99"], "-n/--network: invalid value 'vgg99'"),
    (B + ["--straggle-delay", "fast"], "--straggle-delay: expected seconds (0.32) or a multiple"),
    (B + ["--straggle-prob", "2"], "--straggle-prob: invalid value 2.0"),
    (B + ["--partition", "random"], "--partition: invalid value 'random'; expected one of iid"),
    (["bench", "--dataset", "mnist"], "--dataset: invalid value 'mnist'; expected one of"),
    (B + ["--epochs", "1", "--time-budget", "5"], "--epochs/--time-budget: give one of them"),
    (B + ["--name", "a/b"], "--name: invalid value 'a/b'"),
    (B + ["-ld", "{data}/a-file"], "-ld/--log-dir: invalid value '{data}/a-file'"),
    (B + ["--results-dir", "{data}/a-file"], "--results-dir: invalid value '{data}/a-file'"),
    (B + ["-dd", "/nonexistent/data"], "-dd/--data-dir: invalid value '/nonexistent/data'"),
    (B + ["-b", "1000000000"], "-b/--batch-size: invalid value 1000000000; expected at most"),
    (B + ["--bandwidth", "fast"], "--bandwidth: invalid rate 'fast'"),
    (["bench", "-dd", "{data}/no-test-labels"], "(missing t10k-labels-idx1-ubyte(.gz))"),
    # ---- bench comm
    (C + ["--world-sizes", "inf"], "argument --world-sizes: expected comma-separated whole numbers, got 'inf'"),
    (C + ["--world-sizes", "nan"], "got 'nan'"),
    (C + ["--world-sizes", "0"], "world sizes must be ints >= 2, got 0"),
    (C + ["--world-sizes", "100000"], "world size 100000 is more processes"),
    (C + ["--sizes", "1e13", "--world-sizes", "2"], "size 10000000000000 needs about"),
    (C + ["--sizes", "-5"], "sizes must be positive ints, got -5"),
    (C + ["--algorithms", "foo"], "unknown or unbenchmarked algorithm 'foo'"),
    (C + ["--algorithms", ","], "argument --algorithms: expected at least one of"),
    (C + ["--repeats", "0"], "repeats must be >= 1, got 0"),
    (C + ["--warmup", "-1"], "warmup must be >= 0, got -1"),
    (C + ["--step-ms", "-5"], "argument --step-ms: expected comma-separated milliseconds in (0, 1000], got '-5'"),
    (C + ["--step-ms", "nan"], "argument --step-ms: expected comma-separated milliseconds in (0, 1000], got 'nan'"),
    (C + ["--step-ms", "2000"], "expected comma-separated milliseconds in (0, 1000], got '2000'"),
    (C + ["--step-ms", "5,6"], "argument --step-ms: expected one number, got 2"),
    (C + ["--step-ms", "1000", "--repeats", "1000"], "past the bench's 3600 s"),
    (C + ["--work-ms", "fast"], "argument --work-ms: expected comma-separated milliseconds, got 'fast'"),
    (C + ["--work-ms", "inf"], "argument --work-ms: expected comma-separated milliseconds in (0, 1000], got 'inf'"),
    (C + ["--work-ms", "1"], "argument --work-ms: needs --step-ms, the step it computes in"),
    (C + ["--step-ms", "5", "--work-ms", "6"], "argument --work-ms: invalid value 6; expected at most the step, --step-ms 5"),
    (C + ["--step-ms", "5", "--work-ms", "1,2,3"], "work: expected one value (the world sizes differ), got 3"),
    (C + ["--json", "{data}"], "argument --json: invalid value '{data}'"),
    (C + ["--json", "/dev/null/rows.json"], "argument --json: invalid value '/dev/null/rows.json'"),
    # ---- the command itself
    ([], "the following arguments are required: COMMAND"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["models", "--all"], "unrecognized arguments: --all"),
    (["--plugin", "no_such_module_here", "models"], "no_such_module_here"),
]


def _ids():
    seen: dict[str, int] = {}
    for argv, _ in CASES:
        name = " ".join(argv).replace("{data}/", "") or "(none)"
        seen[name] = seen.get(name, 0) + 1
        yield name if seen[name] == 1 else f"{name} #{seen[name]}"


@pytest.fixture(autouse=True)
def nothing_runs(monkeypatch, tmp_path):
    """The machine's data and environment out of it (only what a case names is found), cwd a
    fresh folder, and whatever would start training, a server or a bench raises: a case that
    is wrongly accepted fails loudly instead of running."""
    import hetsync.bench.comm as comm
    import hetsync.bench.modes as modes
    import hetsync.runtime.launcher as launcher
    import hetsync.runtime.worker as worker
    from hetsync.state import StateServer

    def accepted(*args, **kwargs):
        raise AssertionError("accepted: this would have started a run")

    monkeypatch.delenv(locate.ENV_VAR, raising=False)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(locate, "SYSTEM_DIRS", {"fashion-mnist": (), "cifar10": ()})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(launcher, "Cluster", accepted)
    monkeypatch.setattr(worker, "TrainingLoop", accepted)
    monkeypatch.setattr(StateServer, "serve_forever", accepted)
    monkeypatch.setattr(modes, "execute", accepted)
    monkeypatch.setattr(comm, "_run_world", accepted)
    import hetsync.comm.timeouts as timeouts  # a worker case sets the process-wide default

    monkeypatch.setattr(timeouts, "_default", timeouts._default)


def run_main(argv, capsys) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exit:
        code = exit.code
    return code, capsys.readouterr().err


def assert_one_line(code, err: str, needle: str) -> None:
    assert code not in (0, None), f"accepted (exit {code}): {err}"
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"{len(lines)} lines on stderr:\n{err}"
    assert lines[0].startswith("hetsync") and ": error: " in lines[0], lines[0]
    assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"


@pytest.mark.parametrize("argv, needle", CASES, ids=list(_ids()))
def test_bad_input_is_one_line_naming_it(argv, needle, data, capsys):
    with socket.socket() as taken:  # a port something already listens on
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        fill = {"data": str(data), "taken_port": port}
        code, err = run_main([a.format(**fill) for a in argv], capsys)
    assert_one_line(code, err, needle.format(**fill))


def test_the_corpus_is_large_and_covers_every_subcommand():
    commands = {argv[0] if argv and not argv[0].startswith("-") else argv[-1] if argv else ""
                for argv, _ in CASES}
    assert {"launch", "worker", "state-server", "summarize", "plot", "bench", "models"} <= commands
    assert len(CASES) >= 80


# --------------------------------------------------------------------------- as a user types them
def _hetsync(*argv, cwd) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in (locate.ENV_VAR, "RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "hetsync", *argv], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=120)


@pytest.mark.parametrize("argv, needle", [
    # torch segfaulted (exit -11) with this many threads
    (["worker", "--dataset", "synthetic", "--threads", "100000"], "--threads: invalid value 100000"),
    # launch used to start the workers and relay their tracebacks (its recipe sizes the fastest
    # worker's shard by its batch: 8/15 of 6,000)
    (["launch", "--dataset", "synthetic", "-b", "1000000000", "--quiet"],
     "-b/--batch-size: invalid value 1000000000; expected at most 3200"),
    # a 20-byte pickle declaring 100 GiB: a MemoryError traceback
    (["worker", "--dataset", "cifar10", "-dd", "{data}/cifar-20-bytes"], "data_batch_1: not a valid pickle"),
], ids=["threads-segfault", "launch-batch-size", "cifar-20-bytes"])
def test_as_typed_in_a_shell(argv, needle, data, tmp_path):
    r = _hetsync(*[a.format(data=data) for a in argv], cwd=tmp_path)
    assert_one_line(r.returncode, r.stderr, needle)
    assert r.returncode == 2 and r.stdout == ""
    assert not any(tmp_path.iterdir())  # nothing was started, not even a run directory


def test_a_spares_process_started_with_the_others_is_told_to_join(monkeypatch, capsys):
    """`--spare-workers`: the spare's rank started without --join (as torchrun would start
    every rank) stops with one line saying how it enters, before it connects anywhere."""
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    code, err = run_main(["worker", "-m", "esync-outer", "--workers", "3", "--spare-workers",
                          "1"], capsys)
    assert_one_line(code, err, "rank 2 is a spare (--spare-workers 1): start it with --join")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")  # torchrun started the spare too
    code, err = run_main(["worker", "-m", "esync-outer", "--workers", "3", "--spare-workers",
                          "1"], capsys)
    assert_one_line(code, err, "--spare-workers 1: torchrun started 3 processes, the spares' "
                               "too; start 2 (the first workers)")
    monkeypatch.setenv("WORLD_SIZE", "2")  # the first workers, in a mode whose server's rank
    code, err = run_main(["worker", "-m", "async", "--workers", "3", "--spare-workers",
                          "1"], capsys)  # would be a first worker's
    assert_one_line(code, err, "--spare-workers: under torchrun, only in a mode without a "
                               "parameter server")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")  # started by hand, around torch's own store
    code, err = run_main(["worker", "-m", "esync-outer", "--workers", "3", "--spare-workers",
                          "1"], capsys)
    assert_one_line(code, err, "--spare-workers: the run's store must live outside the "
                               "workers")
