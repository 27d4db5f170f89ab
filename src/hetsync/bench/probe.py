"""`hetsync probe`: measure a cluster's devices and links for the user's model, into a profile.

Run by `torchrun` on every machine (`torchrun ... -m hetsync probe -n lenet -o cluster.json`),
or on one machine with `--workers N` (N processes of its own, optionally emulated devices
with `--slowdowns`, as `launch` runs them). Each rank:

1. builds the model (`-n`, the zoo's) on its device (`-g`) and the data set's batches;
2. with every other rank at once (as they will train: devices that share a host's cores,
   its memory bandwidth or its PCIe slow each other down then too), times its training
   steps — data, forward, backward, optimizer — for `--seconds` after a warm-up, at each of
   `--batch-sizes`; the median of each is its time at that batch, and a least-squares line
   through them gives the device's seconds per step and per sample (`fit_device`); an
   emulated device (`--slowdowns`) sleeps each step up to its factor × the reference step,
   which rank 0 measures first as `launch` does (`reference_work`);
3. where it shares its host with other ranks, times the same steps again alone, one rank
   after another (the others wait at a barrier): a run of the fastest device by itself
   does not share its cores, and `Device.alone` says how fast it is then;
4. reads its memory headroom (CUDA: the device's free memory; CPU: the host's available
   memory over the ranks on it);
5. with every rank: sums vectors of two sizes with the collective hetsync uses
   (`all_reduce`, gloo's or NCCL's ring) and fits α and β to the ring's cost
   2(P−1)α + 2(P−1)/P · S/β (`fit_ring`); and each pair of ranks (with rank 0 only, beyond
   `PAIRS_UP_TO` ranks) ping-pongs messages of the same two sizes: α + S/β each way.

Rank 0 writes the profile (`hetsync.clock.profile`: devices, the ring's link, each device's
worst pair as its own link) and prints it as a table. Every number goes between ranks as a
tensor (no pickle crosses the network), and nothing is left behind but the file.

The reference: FedScale and HALoS take a device's speed from a measured or published
throughput and a link's from α and β; Sailor profiles each GPU type and link once before
planning. hetsync measures on the user's own model and machines, at several batch sizes, so
that a balanced batch's time is known (a GPU's fixed cost per step does not shrink with it).
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import socket
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..clock.network import Link
from ..clock.profile import ClusterProfile, Device, Jitter
from ..command_line import ArgumentParser
from ..config import MAX_SLOWDOWN, Config
from ..options import ConfigError, bounded_float, bounded_int, float_list

#: beyond this many ranks, only the pairs with rank 0 are ping-ponged (P − 1, not P(P − 1)/2)
PAIRS_UP_TO = 8
#: the two message sizes (float32 elements) the links are fitted to: latency- and
#: bandwidth-bound
MESSAGE_SIZES = (16, 4 << 20)
_NAME = 48  # bytes of a device's name in the gathered tensor


@dataclass(frozen=True)
class ProbeOptions:
    network: str = "lenet"
    dataset: str = "fashion-mnist"
    data_dir: str | None = None
    batch_sizes: tuple[int, ...] = (16, 32, 64)
    seconds: float = 2.0
    warmup: int = 3
    slowdowns: tuple[float, ...] = ()
    gpu: int = -1
    threads: int = 1
    out: str = "profile.json"
    repeats: int = 20


def fit_device(batches: Sequence[int], seconds: Sequence[float]) -> tuple[float, float]:
    """(seconds per step, seconds per sample): the least-squares line through the times at
    each batch, neither part below 0 (a line that would cross 0 is taken through it)."""
    n = len(batches)
    if n == 1 or len(set(batches)) == 1:
        return 0.0, statistics.mean(seconds) / batches[0]
    mb, ms = statistics.mean(batches), statistics.mean(seconds)
    slope = (sum((b - mb) * (s - ms) for b, s in zip(batches, seconds))
             / sum((b - mb) ** 2 for b in batches))
    if slope <= 0:  # no measurable cost per sample: all of it per step
        return ms, 0.0
    fixed = ms - slope * mb
    if fixed < 0:  # through the origin
        return 0.0, sum(b * s for b, s in zip(batches, seconds)) / sum(b * b for b in batches)
    return fixed, slope


def fit_line(nbytes: Sequence[float], seconds: Sequence[float]) -> tuple[float, float]:
    """(intercept, seconds per byte) of the line through two (size, time) points, neither
    below 0 (a tiny or negative slope is taken as 1 ns per byte less than measurable)."""
    (s1, s2), (t1, t2) = nbytes, seconds
    per_byte = max((t2 - t1) / (s2 - s1), 1e-12)
    return max(t1 - per_byte * s1, 0.0), per_byte


def fit_ring(nbytes: Sequence[float], seconds: Sequence[float], workers: int) -> Link:
    """The link whose ring all-reduce costs what was measured: 2(P−1)α + 2(P−1)/P · S/β."""
    intercept, per_byte = fit_line(nbytes, seconds)
    alpha = intercept / (2 * (workers - 1))
    return Link(min(alpha, 1.0), 8 * 2 * (workers - 1) / workers / per_byte)


def fit_pair(nbytes: Sequence[float], seconds: Sequence[float]) -> Link:
    """The link of a one-way message: α + S/β."""
    intercept, per_byte = fit_line(nbytes, seconds)
    return Link(min(intercept, 1.0), 8 / per_byte)


def _memory_headroom(device) -> float:
    import torch

    if device.type == "cuda":
        return float(torch.cuda.mem_get_info(device)[0])
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
                return int(line.split()[1]) * 1024 / max(local, 1)
    except OSError:
        pass
    return math.nan


def _device_name(device) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} CPU ({socket.gethostname()})"


def time_steps(cfg: Config, split, device, batch: int, seconds: float, warmup: int,
               factor: float = 1.0, work: float | None = None) -> float:
    """The median wall time of the training steps at `batch` in `seconds` (at least 3) after
    `warmup`: every rank steps for the same time, so each is measured beside the same
    neighbours throughout. An emulated device (`factor` > 1) sleeps each step up to
    `factor` × `work`, the reference device's work at `batch` (`reference_work`), as
    `heterogeneity.StepTimer` does in a run, and that is what is timed."""
    import torch

    from ..runtime.heterogeneity import StepTimer

    torch.manual_seed(cfg.seed)
    model = cfg.build_model(split).to(device)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    criterion = torch.nn.CrossEntropyLoss()
    rng = torch.Generator().manual_seed(cfg.seed + batch)
    n = len(split.train)

    def step() -> float:
        started = time.perf_counter()
        x, y = split.train.batch(torch.randint(n, (batch,), generator=rng))
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad(set_to_none=True)
        criterion(model(x), y).backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - started

    def for_a_while(one, span: float) -> list[float]:
        out, end = [], time.perf_counter() + span
        while len(out) < 3 or time.perf_counter() < end:
            out.append(one())
        return out

    for _ in range(warmup):
        step()
    if factor <= 1:
        return statistics.median(for_a_while(step, seconds))
    timer = StepTimer(factor, cpu_device=device.type == "cpu", work=work)

    def emulated() -> float:
        started = timer.begin()
        step()
        timer.emulate()
        return time.perf_counter() - started

    return statistics.median(for_a_while(emulated, seconds))


def reference_work(cfg: Config, split, batches: Sequence[int], rank: int,
                   world: int) -> list[float]:
    """Emulated devices (`--slowdowns`): the reference device's work per step at each of
    `batches`, as `launch` measures it for its workers (`emulation.measure_step_work`: warm,
    alone), by rank 0 while the others wait, then sent to every rank. All emulated devices
    run on it: one that sleeps most of its step computes on a cold cache, and its own CPU
    time would make it slower than its factor says (as in a run)."""
    import dataclasses

    import torch
    import torch.distributed as dist

    from ..runtime.emulation import measure_step_work

    works = torch.zeros(len(batches), dtype=torch.float64)
    if rank == 0:
        for i, b in enumerate(batches):
            works[i] = measure_step_work(dataclasses.replace(cfg, batch_size=b), split,
                                         steps=30, warmup=5, seconds=1.0)
    if world > 1:
        dist.broadcast(works, src=0)
    return works.tolist()


def probe_rank(rank: int, world: int, opts: ProbeOptions, stream=sys.stdout) -> None:
    """One rank's part (the module docstring); rank 0 also writes the profile."""
    import torch
    import torch.distributed as dist

    from ..runtime.devices import pick_device

    torch.set_num_threads(opts.threads)
    cfg = Config(network=opts.network, dataset=opts.dataset, data_dir=opts.data_dir,
                 gpu=opts.gpu, threads=opts.threads, batch_size=max(opts.batch_sizes))
    device = pick_device(cfg, local_rank=int(os.environ.get("LOCAL_RANK", "0")))
    split = cfg.load_data()
    factor = opts.slowdowns[rank] if opts.slowdowns else 1.0
    say = (lambda text: print(f"probe: {text}", file=stream, flush=True)) if rank == 0 \
        else (lambda text: None)
    say(f"{world} rank(s), {opts.network} on {opts.dataset}, batches "
        f"{', '.join(map(str, opts.batch_sizes))}: every device at once")
    works = (reference_work(cfg, split, opts.batch_sizes, rank, world) if opts.slowdowns
             else [None] * len(opts.batch_sizes))
    times = []
    for b, work in zip(opts.batch_sizes, works):
        if world > 1:
            dist.barrier()  # (every rank times the same batch beside the same neighbours)
        times.append(time_steps(cfg, split, device, b, opts.seconds, opts.warmup, factor,
                                work))
    fixed, per_sample = fit_device(opts.batch_sizes, times)
    hosts = [bytes(h.tolist()).rstrip(b"\0") for h in _gather(_text(socket.gethostname()),
                                                             world)]
    shared = [r for r in range(world) if hosts.count(hosts[r]) > 1]
    alone = [math.nan, math.nan]
    if shared:
        say(f"rank(s) {', '.join(map(str, shared))} share a host: each timed again alone, "
            f"in turn")
    for r in shared:
        dist.barrier()
        if r == rank:
            alone = list(fit_device(opts.batch_sizes, [
                time_steps(cfg, split, device, b, opts.seconds, opts.warmup, factor, work)
                for b, work in zip(opts.batch_sizes, works)]))
    if shared:
        dist.barrier()
    mine = torch.tensor([fixed, per_sample, _memory_headroom(device), *alone, *times],
                        dtype=torch.float64)
    print(f"probe: rank {rank}: "
          + ", ".join(f"{1000 * t:.2f} ms at {b}" for b, t in zip(opts.batch_sizes, times))
          + f" -> {1000 * fixed:.3f} ms per step + {1e6 * per_sample:.2f} µs per sample"
          + ("" if math.isnan(alone[0]) else
             f" (alone: {1000 * alone[0]:.3f} ms + {1e6 * alone[1]:.2f} µs)"),
          file=stream, flush=True)
    devices = _gather(mine, world)
    names = _gather(_text(_device_name(device)), world)
    ring, pairs = (None, {}) if world == 1 else _links(rank, world, opts, say)
    if rank != 0:
        return
    worst: dict[int, Link] = {}
    for (a, b), link in pairs.items():
        for r in (a, b):
            old = worst.get(r)
            worst[r] = link if old is None else Link(max(old.latency_s, link.latency_s),
                                                     min(old.bandwidth_bps,
                                                         link.bandwidth_bps))
    profile = ClusterProfile(
        tuple(Device(bytes(names[r].tolist()).rstrip(b"\0").decode(errors="replace"),
                     float(devices[r][0]), float(devices[r][1]),
                     None if math.isnan(devices[r][2]) else float(devices[r][2]),
                     worst.get(r), None if math.isnan(devices[r][3]) else
                     (float(devices[r][3]), float(devices[r][4])))
              for r in range(world)),
        ring or Link(), Jitter(), model=opts.network,
        source=(f"measured by hetsync probe on {socket.gethostname()} at "
                f"{time.strftime('%Y-%m-%d %H:%M')}: {opts.network} on {opts.dataset}, "
                f"batches {', '.join(map(str, opts.batch_sizes))}, {opts.seconds:g} s each"
                + (f", emulated slowdowns {', '.join(f'{f:g}' for f in opts.slowdowns)}"
                   if opts.slowdowns else "")))
    profile.save(opts.out)
    print(format_profile(profile, {r: devices[r][5:].tolist() for r in range(world)},
                         opts.batch_sizes, pairs), file=stream)
    print(f"probe: wrote {opts.out} (`hetsync launch --profile {opts.out}` runs on it; "
          f"`hetsync advise {opts.out}` compares the schemes on it)", file=stream, flush=True)


def _text(text: str):
    """`text` as a tensor of `_NAME` bytes, to gather (no pickle crosses the network)."""
    import torch

    out = torch.zeros(_NAME, dtype=torch.uint8)
    raw = text.encode()[:_NAME]
    out[:len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
    return out


def _gather(tensor, world: int) -> list:
    import torch
    import torch.distributed as dist

    if world == 1:
        return [tensor]
    out = [torch.zeros_like(tensor) for _ in range(world)]
    dist.all_gather(out, tensor)
    return out


def _links(rank: int, world: int, opts: ProbeOptions, say) -> tuple[Link, dict]:
    """(the ring's link, {(a, b): the pair's link}) measured by every rank together."""
    import torch
    import torch.distributed as dist

    say(f"links: all-reduce of {' and '.join(f'{4 * n:,} bytes' for n in MESSAGE_SIZES)}")
    ring_times = []
    for n in MESSAGE_SIZES:
        buf = torch.ones(n)
        samples = []
        for i in range(3 + opts.repeats):
            dist.barrier()
            started = time.perf_counter()
            dist.all_reduce(buf)
            took = torch.tensor([time.perf_counter() - started], dtype=torch.float64)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)  # (the slowest rank's, outside)
            if i >= 3:
                samples.append(float(took))
        ring_times.append(statistics.median(samples))
    ring = fit_ring([4 * n for n in MESSAGE_SIZES], ring_times, world)
    pairs = [(a, b) for a in range(world) for b in range(a + 1, world)
             if world <= PAIRS_UP_TO or a == 0]
    say(f"links: {len(pairs)} pair(s), ping-pong of the same sizes")
    measured = {}
    for a, b in pairs:
        one_way = torch.zeros(len(MESSAGE_SIZES), dtype=torch.float64)
        if rank in (a, b):
            peer = b if rank == a else a
            for k, n in enumerate(MESSAGE_SIZES):
                buf = torch.ones(n)
                samples = []
                for i in range(3 + opts.repeats):
                    started = time.perf_counter()
                    if rank == a:
                        dist.send(buf, peer)
                        dist.recv(buf, peer)
                    else:
                        dist.recv(buf, peer)
                        dist.send(buf, peer)
                    if i >= 3:
                        samples.append((time.perf_counter() - started) / 2)
                one_way[k] = statistics.median(samples)
        dist.all_reduce(one_way, op=dist.ReduceOp.MAX)  # (both ends measured; the slower)
        measured[(a, b)] = fit_pair([4 * n for n in MESSAGE_SIZES], one_way.tolist())
    return ring, measured


def format_profile(profile: ClusterProfile, times: dict, batches: Sequence[int],
                   pairs: dict) -> str:
    head = (["rank", "device"] + [f"ms at {b}" for b in batches]
            + ["ms per step", "µs per sample", "speed (x fastest)", "memory free GB"])
    alone = any(d.alone is not None for d in profile.devices)
    if alone:
        head.insert(-1, f"ms alone at {max(batches)}")
    fastest = min(d.seconds(max(batches)) for d in profile.devices)
    rows = [[str(r), d.name[:32]] + [f"{1000 * t:.2f}" for t in times[r]]
            + [f"{1000 * d.step_s:.3f}", f"{1e6 * d.sample_s:.2f}",
               f"{fastest / d.seconds(max(batches)):.3f}"]
            + ([f"{1000 * d.by_itself().seconds(max(batches)):.2f}"] if alone else [])
            + ["—" if d.memory_bytes is None else f"{d.memory_bytes / 1e9:.1f}"]
            for r, d in enumerate(profile.devices)]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    lines += [" | ".join(row) for row in rows]
    lines.append(f"links: all-reduce fitted to the ring: {profile.link.describe()}")
    if pairs:
        slow = max(pairs.items(), key=lambda kv: kv[1].message_seconds(4 * MESSAGE_SIZES[1]))
        lines.append(f"pairs: {len(pairs)} measured; the slowest {slow[0][0]}-{slow[0][1]}: "
                     f"{slow[1].describe()}")
    return "\n".join(lines)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawned(rank: int, world: int, port: int, opts: ProbeOptions) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    try:
        probe_rank(rank, world, opts)
        _leave_together()
    except BaseException:
        dist.destroy_process_group()
        raise
    # Gloo's teardown still aborted now and then after the barrier below ("terminate called
    # without an active exception", a fresh clone's suite, 2026-11-30); the profile is
    # written and every rank is done, so the process leaves without it, as `launch` does.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _leave_together() -> None:
    """A barrier after rank 0 has written the profile: a rank that tore its group down while
    rank 0 still wrote aborted one run in ten here ("terminate called without an active
    exception", in gloo's teardown)."""
    import torch.distributed as dist

    if dist.get_world_size() > 1:
        dist.barrier()


def run(opts: ProbeOptions, workers: int) -> None:
    """Under torchrun (its environment): this rank's part. Else `workers` processes of its
    own on this machine (one: this process alone)."""
    import torch.distributed as dist

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group(os.environ.get("HETSYNC_BACKEND", "gloo"),
                                timeout=datetime.timedelta(seconds=300))
        try:
            probe_rank(dist.get_rank(), dist.get_world_size(), opts)
            _leave_together()
        finally:
            dist.destroy_process_group()
        return
    if workers == 1:
        probe_rank(0, 1, opts)
        return
    import torch.multiprocessing as mp

    mp.start_processes(_spawned, args=(workers, _free_port(), opts), nprocs=workers,
                       start_method="spawn")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--network", default="lenet",
                   help="the zoo's model (hetsync models), or MODULE:FACTORY, your own: "
                        "FACTORY(input_shape, num_classes) returns an nn.Module")
    p.add_argument("--dataset", default="fashion-mnist", help="its data set")
    p.add_argument("--data-dir", default=None, help="where the data set is")
    p.add_argument("--batch-sizes", type=_batches, default=(16, 32, 64),
                   help="B1,B2,...: the batches each device is timed at (default: 16,32,64)")
    p.add_argument("--seconds", type=bounded_float(0, 600, "seconds"), default=2.0,
                   help="how long each batch size is timed, every rank at once (default: 2)")
    p.add_argument("--workers", type=bounded_int(1, 64, "a number of ranks"), default=1,
                   help="without torchrun: this many ranks on this machine (default: 1)")
    p.add_argument("--slowdowns", type=float_list(0, MAX_SLOWDOWN, "slowdown factors"),
                   default=(),
                   help="F1,F2,...: each rank an emulated device this many times slower, as "
                   "launch runs them (one per rank, also under torchrun)")
    p.add_argument("-g", "--gpu", type=int, default=-1, help="GPU index (-1: the CPU)")
    p.add_argument("--threads", type=bounded_int(1, 256, "a number of threads"), default=1,
                   help="torch threads per rank (default: 1, as launch's workers)")
    p.add_argument("-o", "--out", default="profile.json", help="the profile to write "
                   "(default: profile.json)")


def _batches(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        values = ()
    if not values or any(not 1 <= b <= 1 << 16 for b in values):
        raise argparse.ArgumentTypeError(f"invalid value {text!r}; expected comma-separated "
                                         f"batch sizes in 1..65536, e.g. 16,32,64")
    return tuple(sorted(set(values)))


def options_from_args(args) -> ProbeOptions:
    """The probe's options; ConfigError naming the flag that is wrong."""
    ranks = int(os.environ.get("WORLD_SIZE", args.workers))  # (torchrun's, or our own)
    if args.slowdowns and len(args.slowdowns) != ranks:
        raise ConfigError(f"--slowdowns: invalid value {','.join(map(str, args.slowdowns))}; "
                          f"expected {ranks} factors (one per rank)")
    if any(f < 1 for f in args.slowdowns):
        raise ConfigError(f"--slowdowns: invalid value {','.join(map(str, args.slowdowns))}; "
                          f"expected factors in 1..{MAX_SLOWDOWN:g} (1 = full speed)")
    out = Path(args.out)
    if not out.parent.is_dir():
        raise ConfigError(f"-o/--out: invalid value {args.out!r}; its folder does not exist")
    Config(network=args.network, dataset=args.dataset, data_dir=args.data_dir,
           gpu=args.gpu, batch_size=max(args.batch_sizes)).validate()
    return ProbeOptions(network=args.network, dataset=args.dataset, data_dir=args.data_dir,
                        batch_sizes=args.batch_sizes, seconds=args.seconds,
                        slowdowns=tuple(args.slowdowns), gpu=args.gpu, threads=args.threads,
                        out=args.out)

