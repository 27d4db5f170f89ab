"""IDX reader: good files of every dtype (raw and gzip), and each kind of corruption."""

from __future__ import annotations

import gzip
import os
import struct

import numpy as np
import pytest

from hetsync.data import IdxFormatError, read_idx, write_idx

DTYPES = [
    (0x08, np.uint8),
    (0x09, np.int8),
    (0x0B, np.int16),
    (0x0C, np.int32),
    (0x0D, np.float32),
    (0x0E, np.float64),
]


def idx_bytes(code: int, shape: tuple[int, ...], body: bytes) -> bytes:
    return bytes([0, 0, code, len(shape)]) + struct.pack(f">{len(shape)}I", *shape) + body


def put(path, data: bytes):
    if str(path).endswith(".gz"):
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gz"])
@pytest.mark.parametrize("code,dtype", DTYPES, ids=[np.dtype(d).name for _, d in DTYPES])
def test_reads_every_dtype_big_endian(tmp_path, code, dtype, gz):
    rng = np.random.default_rng(code)
    shape = (3, 4, 5)
    info = np.iinfo(dtype) if np.issubdtype(dtype, np.integer) else None
    if info is not None:
        arr = rng.integers(info.min, info.max, size=shape, endpoint=True).astype(dtype)
    else:
        arr = rng.standard_normal(shape).astype(dtype)
    # Written by hand in big-endian, independently of write_idx.
    body = arr.astype(np.dtype(dtype).newbyteorder(">")).tobytes()
    path = put(tmp_path / ("a.idx" + (".gz" if gz else "")), idx_bytes(code, shape, body))
    out = read_idx(path)
    assert out.dtype == np.dtype(dtype) and out.dtype.isnative
    assert out.shape == shape
    np.testing.assert_array_equal(out, arr)
    assert out.flags.writeable


@pytest.mark.parametrize("shape", [(7,), (2, 3), (2, 3, 4), (1, 2, 3, 4), (0, 5)])
def test_write_read_round_trip_all_ranks(tmp_path, shape):
    arr = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape) - 3
    for name in ("x.idx", "x.idx.gz"):
        write_idx(tmp_path / name, arr)
        np.testing.assert_array_equal(read_idx(tmp_path / name), arr)


def test_gzip_detected_by_content_without_suffix(tmp_path):
    path = tmp_path / "labels-idx1-ubyte"
    path.write_bytes(gzip.compress(idx_bytes(0x08, (3,), b"\x01\x02\x03")))
    np.testing.assert_array_equal(read_idx(path), [1, 2, 3])


def expect_error(path, *fragments):
    with pytest.raises(IdxFormatError) as info:
        read_idx(path)
    msg = str(info.value)
    assert str(path) in msg, msg
    for f in fragments:
        assert f in msg, f"{f!r} not in {msg!r}"
    return msg


@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gz"])
def test_bad_magic(tmp_path, gz):
    path = put(tmp_path / ("m.idx" + (".gz" if gz else "")), b"\x00\x01\x08\x01" + struct.pack(">I", 1) + b"\x00")
    expect_error(path, "magic", "00 00", "00 01")


def test_unknown_dtype_code(tmp_path):
    path = put(tmp_path / "d.idx", idx_bytes(0x0A, (2,), b"\x00\x00"))
    expect_error(path, "0x0A", "0x08 uint8", "0x0E float64")


@pytest.mark.parametrize("ndim", [0, 5])
def test_bad_number_of_dims(tmp_path, ndim):
    path = put(tmp_path / "n.idx", bytes([0, 0, 8, ndim]) + b"\x00" * 40)
    expect_error(path, f"{ndim} dimensions", "1 to 4")


def test_header_shorter_than_dims(tmp_path):
    path = put(tmp_path / "h.idx", bytes([0, 0, 8, 3]) + struct.pack(">I", 5))
    expect_error(path, "header has 8 bytes", "expected 16")


def test_empty_file(tmp_path):
    path = put(tmp_path / "e.idx", b"")
    expect_error(path, "0 bytes")


@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gz"])
def test_truncated_body(tmp_path, gz):
    body = b"\x00" * (10 * 28 * 28 - 1)
    path = put(tmp_path / ("train-images-idx3-ubyte" + (".gz" if gz else "")), idx_bytes(8, (10, 28, 28), body))
    msg = expect_error(path, "body has 7839 bytes", "expected 7840", "(10, 28, 28)", "uint8")
    assert "truncated" in msg


def test_trailing_bytes(tmp_path):
    path = put(tmp_path / "t.idx", idx_bytes(0x0C, (2, 2), b"\x00" * 17))
    msg = expect_error(path, "body has 17 bytes", "expected 16", "(2, 2)", "int32")
    assert "trailing" in msg


def test_corrupt_gzip_stream(tmp_path):
    good = gzip.compress(idx_bytes(8, (100,), bytes(range(100))))
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF  # flip bits in the deflate data or CRC
    path = tmp_path / "c.idx.gz"
    path.write_bytes(bytes(bad))
    expect_error(path, "corrupt gzip")


def test_truncated_gzip_stream(tmp_path):
    good = gzip.compress(idx_bytes(8, (1000,), bytes(1000)))
    path = tmp_path / "c.idx.gz"
    path.write_bytes(good[: len(good) - 10])
    expect_error(path, "corrupt gzip")


def test_gz_name_without_gzip_content(tmp_path):
    path = tmp_path / "plain.idx.gz"
    path.write_bytes(idx_bytes(8, (1,), b"\x05"))
    expect_error(path, "not a gzip stream", "1f 8b", "00 00")


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_idx(tmp_path / "nope.idx")


def test_idx_format_error_is_value_error():
    assert issubclass(IdxFormatError, ValueError)


def test_write_rejects_bad_arrays(tmp_path):
    with pytest.raises(ValueError, match="uint16"):
        write_idx(tmp_path / "x", np.zeros(3, np.uint16))
    with pytest.raises(ValueError, match="5 dimensions"):
        write_idx(tmp_path / "x", np.zeros((1,) * 5, np.uint8))


def test_a_compressed_files_array_is_cached_and_read_afresh_once_the_file_changes(
        tmp_path, monkeypatch):
    monkeypatch.setenv("HETSYNC_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "a-idx1-ubyte.gz"
    write_idx(path, np.arange(5, dtype=np.uint8))
    np.testing.assert_array_equal(read_idx(path), np.arange(5))
    cached, = (tmp_path / "cache" / "idx").glob("a-idx1-ubyte.gz-*.npy")
    assert np.load(cached).tolist() == [0, 1, 2, 3, 4]
    cached.write_bytes(b"cut short")  # a cache that cannot be read is passed over
    np.testing.assert_array_equal(read_idx(path), np.arange(5))
    write_idx(path, np.arange(3, dtype=np.uint8))  # the file changes: its array is read again
    os.utime(path, ns=(1, 1))
    np.testing.assert_array_equal(read_idx(path), np.arange(3))
    with pytest.raises(IdxFormatError, match="corrupt gzip stream"):  # never the cache's
        path.write_bytes(b"\x1f\x8b" + b"\x00" * 20)
        read_idx(path)


def test_no_cache_where_it_is_turned_off_or_the_file_is_raw(tmp_path, monkeypatch):
    monkeypatch.setenv("HETSYNC_CACHE", "none")
    write_idx(tmp_path / "a.gz", np.arange(5, dtype=np.uint8))
    read_idx(tmp_path / "a.gz")
    monkeypatch.setenv("HETSYNC_CACHE", str(tmp_path / "cache"))
    write_idx(tmp_path / "raw", np.arange(5, dtype=np.uint8))
    read_idx(tmp_path / "raw")
    assert not (tmp_path / "cache").exists()
