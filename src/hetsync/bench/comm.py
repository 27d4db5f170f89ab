"""All-reduce micro-benchmark: hetsync's algorithms against the backend's own, same run.

Spawns P gloo processes on loopback per world size; for each vector length (float32) it
runs every algorithm ``warmup`` times, then ``repeats`` timed times, interleaved so that
load drifts hit all alike. A sample is the slowest rank's time for one call (the ranks
start together after a barrier; the max is taken with an all-reduce outside the timed
region); the latency is the median sample.

With ``step`` (``--step-ms``) each call comes after an emulated device's step instead of the
barrier, as a blocking sum comes in training: every rank computes its ``work`` (``--work-ms``:
that much of its own CPU time), sleeps to the step's end (`heterogeneity.emulated_sleep`,
without the make-up of oversleeps that an emulated device in `launch` has), then sums; the
sample is the slowest rank's time from its waking to the sum's return, which holds its wait
for a rank that woke later (``late_s``: the median of how far past the step's end the last
rank woke). The ranks are not pinned to cores as `launch` pins emulated devices.

Bus bandwidth follows the nccl-tests convention::

    algbw = bytes / latency          busbw = algbw * 2 (P - 1) / P

which is the per-link rate a bandwidth-optimal all-reduce needs, comparable across P.
Each row also carries the backend's own (``native``) latency and busbw from the same run and
the ratio busbw / native busbw.

Usage::

    python -m hetsync.bench.comm --world-sizes 2,4 --sizes 1e3,1e5,1e7 --json out.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import queue
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Sequence

from ..comm.collectives import ALGORITHMS
from ..command_line import ArgumentParser
from ..config import unwritable_dir
from ..options import float_list

DEFAULT_SIZES = (10**3, 10**4, 10**5, 10**6, 10**7)
DEFAULT_ALGORITHMS = ("native", "ring", "butterfly", "binary-blocks", "star")
BENCH_ALGORITHMS = tuple(a for a in ALGORITHMS if a != "ps")


def auto_repeats(numel: int) -> int:
    """Timed repetitions for a vector of ``numel`` floats when none are given."""
    if numel <= 10**4:
        return 50
    if numel <= 10**5:
        return 20
    if numel <= 10**6:
        return 10
    return 5


def bus_bandwidth(nbytes: int, seconds: float, world_size: int) -> float:
    """nccl-tests bus bandwidth in bytes/s: bytes / seconds * 2 (P - 1) / P."""
    if seconds <= 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    return nbytes / seconds * 2 * (world_size - 1) / world_size


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _compute(seconds: float) -> None:
    """`seconds` of this thread's CPU time in small matrix products (a device's step)."""
    import torch

    a, start = torch.randn(64, 64), time.thread_time()
    a = a / a.norm()
    while time.thread_time() - start < seconds:
        a = torch.tanh(a @ a)


def _rank_main(rank: int, world_size: int, port: int, sizes: Sequence[int],
               algorithms: Sequence[str], repeats: int | None, warmup: int, results,
               step: float = 0.0, work: Sequence[float] = ()) -> None:
    import torch
    import torch.distributed as dist

    from ..comm import all_reduce
    from ..runtime.heterogeneity import emulated_sleep

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=600))
        rows = []
        for n in sizes:
            src = torch.randn(n, generator=torch.Generator().manual_seed(rank))
            buf = src.clone()
            ref = src.clone()
            dist.all_reduce(ref)
            verified = {}
            reps = repeats or auto_repeats(n)
            samples: dict[str, list[float]] = {a: [] for a in algorithms}
            late: dict[str, list[float]] = {a: [] for a in algorithms}
            elapsed = torch.zeros(2, dtype=torch.float64)  # (the call, woken past the step)
            for i in range(warmup + reps):
                for alg in algorithms:
                    buf.copy_(src)
                    if step:  # (the previous sample's max has lined the ranks up)
                        started = time.perf_counter()
                        _compute(work[rank % len(work)])
                        time.sleep(emulated_sleep(1.0, time.perf_counter() - started, step))
                    else:
                        dist.barrier()
                    t0 = time.perf_counter()
                    all_reduce(buf, alg)
                    elapsed[0] = time.perf_counter() - t0
                    elapsed[1] = t0 - started - step if step else 0.0
                    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                    if i == 0:   # every algorithm's result is checked against the backend's
                        ok = torch.tensor([int(torch.allclose(buf, ref, rtol=1e-4, atol=1e-4))])
                        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
                        verified[alg] = bool(ok.item())
                    if i >= warmup:
                        samples[alg].append(float(elapsed[0]))
                        late[alg].append(float(elapsed[1]))
            for alg in algorithms:
                rows.append({"world_size": world_size, "numel": n, "bytes": 4 * n,
                             "dtype": "float32", "algorithm": alg, "repeats": reps,
                             "latency_s": statistics.median(samples[alg]),
                             "min_s": min(samples[alg]), "max_s": max(samples[alg]),
                             "verified": verified[alg], "step_s": step,
                             "work_s": list(work), "late_s": statistics.median(late[alg])})
        results.put((rank, True, rows if rank == 0 else None))
    except BaseException as exc:  # report, never hang the parent
        import traceback
        results.put((rank, False, f"{exc!r}\n{traceback.format_exc()}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _run_world(world_size: int, sizes, algorithms, repeats, warmup, timeout: float,
               step: float = 0.0, work: Sequence[float] = ()) -> list:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, daemon=True,
                         args=(r, world_size, port, tuple(sizes), tuple(algorithms), repeats,
                               warmup, results, step, tuple(work)))
             for r in range(world_size)]
    for p in procs:
        p.start()
    rows, done = None, set()
    deadline = time.monotonic() + timeout
    try:
        while len(done) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"comm bench with {world_size} ranks did not finish in "
                                   f"{timeout:g} s")
            try:
                rank, ok, value = results.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if r not in done and not p.is_alive()]
                if dead:
                    raise RuntimeError(f"bench ranks {dead} died (exit codes "
                                       f"{[procs[r].exitcode for r in dead]})")
                continue
            if not ok:
                raise RuntimeError(f"bench rank {rank} failed: {value}")
            done.add(rank)
            if rank == 0:
                rows = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return rows


def run_comm_bench(world_sizes: Sequence[int] = (2, 4), sizes: Sequence[int] = DEFAULT_SIZES,
                   algorithms: Sequence[str] = DEFAULT_ALGORITHMS,
                   repeats: int | None = None, warmup: int = 2,
                   timeout: float = 3600.0, step: float = 0.0,
                   work: Sequence[float] = ()) -> list[dict]:
    """Time each all-reduce algorithm on float32 vectors; return one row per (P, n, algorithm).

    ``native`` is always measured (added if missing) as the reference. Each row has
    ``world_size, numel, bytes, dtype, algorithm, repeats, latency_s`` (median), ``min_s,
    max_s, verified`` (the first result matched native's on every rank), ``step_s, work_s,
    late_s``, ``busbw_GBps, native_latency_s, native_busbw_GBps, busbw_ratio``. ``step`` > 0
    (at most 1 s): each sum after an emulated step of that many seconds, in which rank r
    computes ``work[r]`` seconds (one value: every rank; the module docstring).
    """
    for p in world_sizes:
        if isinstance(p, bool) or not isinstance(p, int) or p < 2:
            raise ValueError(f"world sizes must be ints >= 2, got {p!r}")
    for n in sizes:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"sizes must be positive ints, got {n!r}")
    for a in algorithms:
        if a not in BENCH_ALGORITHMS:
            raise ValueError(f"unknown or unbenchmarked algorithm {a!r}; valid: "
                             f"{', '.join(BENCH_ALGORITHMS)}")
    if repeats is not None and repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if not 0 <= step <= 1:
        raise ValueError(f"step must be in [0, 1] seconds, got {step!r}")
    if work and not step:
        raise ValueError("work needs a step > 0 to compute in")
    if step and not work:
        work = (0.0,)
    if step and not all(0 <= w <= step for w in work):
        raise ValueError(f"work must be in [0, step = {step:g}] seconds each, got "
                         f"{', '.join(f'{w:g}' for w in work)}")
    if len(work) > 1 and any(p != len(work) for p in world_sizes):
        one = ("one value or one per rank" if len(set(world_sizes)) == 1
               else "one value (the world sizes differ)")
        raise ValueError(f"work: expected {one}, got {len(work)} for world size(s) "
                         f"{', '.join(map(str, world_sizes))}")
    calls = len(set(algorithms) | {"native"}) * sum(warmup + (repeats or auto_repeats(n))
                                                   for n in sizes)
    if step * calls > timeout:
        raise ValueError(f"step: {calls} sums a world size after steps of {step:g} s take "
                         f"{step * calls:.0f} s, past the bench's {timeout:g} s: a shorter "
                         f"step, or fewer sizes, algorithms or repeats")
    algs = ("native",) + tuple(a for a in dict.fromkeys(algorithms) if a != "native")
    out = []
    for p in world_sizes:
        rows = _run_world(p, sizes, algs, repeats, warmup, timeout, step, work)
        native = {r["numel"]: r["latency_s"] for r in rows if r["algorithm"] == "native"}
        for r in rows:
            if r["algorithm"] not in algorithms:   # native measured only as the reference
                continue
            r["busbw_GBps"] = bus_bandwidth(r["bytes"], r["latency_s"], p) / 1e9
            r["native_latency_s"] = native[r["numel"]]
            r["native_busbw_GBps"] = bus_bandwidth(r["bytes"], native[r["numel"]], p) / 1e9
            r["busbw_ratio"] = r["busbw_GBps"] / r["native_busbw_GBps"]
            out.append(r)
    return out


def format_table(rows: Sequence[dict]) -> str:
    """A Markdown table of ``rows`` (from :func:`run_comm_bench`)."""
    head = ("| P | floats | MB | algorithm | latency ms | busbw GB/s | native ms | "
            "native busbw GB/s | busbw / native | verified |")
    lines = [head, "|---:|---:|---:|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(
            f"| {r['world_size']} | {r['numel']:.0e} | {r['bytes'] / 1e6:.3g} | "
            f"{r['algorithm']} | {r['latency_s'] * 1e3:.3f} | {r['busbw_GBps']:.3f} | "
            f"{r['native_latency_s'] * 1e3:.3f} | {r['native_busbw_GBps']:.3f} | "
            f"{r['busbw_ratio']:.2f} | {'yes' if r['verified'] else 'NO'} |")
    return "\n".join(lines)


def _int_list(text: str) -> list[int]:
    try:
        return [int(float(x)) for x in text.split(",") if x.strip()]
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got "
                                         f"{text!r}") from None


def _check_fits(world_sizes: Sequence[int], sizes: Sequence[int]) -> None:
    """ValueError when the bench cannot run on this machine: more ranks than it can hold
    (at most 64, or 2 per CPU on bigger ones: every rank is a process here), or vectors too
    big for its memory (every rank holds a few copies of each)."""
    most = max(64, 2 * (os.cpu_count() or 1))
    big = [p for p in world_sizes if p > most]
    if big:
        raise ValueError(f"world size {big[0]} is more processes than this machine runs "
                         f"for a bench; expected at most {most}")
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    need = max(sizes, default=0) * 4 * 4 * max(world_sizes, default=0)
    if need > memory:
        raise ValueError(f"size {max(sizes)} needs about {need / 2**30:.0f} GiB (4 copies of "
                         f"{max(sizes)} float32 per rank, {max(world_sizes)} ranks); this "
                         f"machine has {memory / 2**30:.0f} GiB")


def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="hetsync bench comm",
        description="Time hetsync's all-reduce algorithms against native gloo on loopback.")
    parser.add_argument("--world-sizes", type=_int_list, default=[2, 4],
                        help="comma-separated process counts (default 2,4)")
    parser.add_argument("--sizes", type=_int_list, default=list(DEFAULT_SIZES),
                        help="comma-separated float32 vector lengths, 1e7 notation allowed "
                             "(default 1e3,1e4,1e5,1e6,1e7)")
    parser.add_argument("--algorithms", default=",".join(DEFAULT_ALGORITHMS),
                        help=f"comma-separated, from {', '.join(BENCH_ALGORITHMS)}")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed repetitions per point (default: 50 down to 5 by size)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs first (default 2)")
    parser.add_argument("--step-ms", type=float_list(0, 1000, "milliseconds"), default=None,
                        help="each sum after an emulated device's step this long: compute "
                             "--work-ms, sleep to its end (default: after a barrier)")
    parser.add_argument("--work-ms", type=float_list(0, 1000, "milliseconds"), default=(),
                        help="with --step-ms: each rank's CPU time in the step, one value or "
                             "one per rank, at most the step (default 0)")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    step = args.step_ms or (0.0,)
    if len(step) > 1:
        parser.error(f"argument --step-ms: expected one number, got {len(step)}")
    if args.work_ms and not args.step_ms:
        parser.error("argument --work-ms: needs --step-ms, the step it computes in")
    if max(args.work_ms, default=0) > step[0]:
        parser.error(f"argument --work-ms: invalid value {max(args.work_ms):g}; expected at "
                     f"most the step, --step-ms {step[0]:g}")
    algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    if not algorithms:
        parser.error(f"argument --algorithms: expected at least one of "
                     f"{', '.join(BENCH_ALGORITHMS)}, got {args.algorithms!r}")
    reason = None if args.json is None else unwritable_dir(Path(args.json).parent)
    if reason is None and args.json is not None and Path(args.json).is_dir():
        reason = f"{args.json} is a directory"
    if reason is not None:  # found before the bench, not after it
        parser.error(f"argument --json: invalid value {args.json!r}; expected a file this "
                     f"process can write ({reason})")
    try:
        _check_fits(args.world_sizes, args.sizes)
        rows = run_comm_bench(args.world_sizes, args.sizes, algorithms, args.repeats,
                              args.warmup, step=step[0] / 1e3,
                              work=[w / 1e3 for w in args.work_ms])
    except ValueError as err:
        parser.error(str(err))
    if args.step_ms:
        work = ", ".join(f"{w:g}" for w in args.work_ms or [0])
        late = ", ".join(f"{r['late_s'] * 1e3:.2f}" for r in rows)
        print(f"each sum after an emulated step of {step[0]:g} ms (CPU work {work} ms), not a "
              f"barrier; the last rank woke {late} ms past its end (median, by row)")
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
