"""`hetsync advise PROFILE`: which devices, which scheme — predicted on the virtual clock.

On the devices and links of a profile (`hetsync probe` writes one; `hetsync.clock.profile`):

1. the subsets of devices worth trying: all of them, then all but the slowest, cut where the
   devices' speeds differ (by more than 5 %), the largest `--subsets` of at least two
   devices (`subsets`); and the fastest device alone;
2. on each subset, a bench (`hetsync.bench.modes`) of the candidate schemes (`--modes`), each
   at a rate of its own (linear scaling, or the best of `--lr-sweep`), for `--budget` virtual
   seconds with real gradients on the model and data given; the fastest device alone trains
   each one-device recipe (`--reference`) in a bench of its own, at its speed alone on its
   host (`Device.alone`: devices that share a host slow each other down; a device by itself
   does not);
3. every candidate ranked by its predicted time to `--target` (the ones that miss it after
   those that reach it, by their final figure), each with its speed-up over the fastest device
   alone and over `sync` on every device, its capacity (its devices' summed speed over the
   fastest's) and efficiency (the speed-up over the capacity);
4. the table printed and written (`advice.md`, `advice.json`), the predicted curves drawn
   (`accuracy.png` or `loss.png`, the fastest device dashed), and the winner's settings:
   `hetsync launch --profile`, `torchrun ... hetsync worker` and `hetsync.wrap`. When the
   fastest device alone wins, it says why: a sum of the model costs more than its step on
   these links, or the other devices' updates cost more than their speed adds.

Where hetsync departs from the planners it is compared with (Sailor, Metis): they plan a
synchronous split on the devices given; advise compares whole schemes, including leaving
devices out and the device alone, by training the user's model for a short time — a
prediction from a short budget, which a longer run can overturn (say so when ranking).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..clock.profile import ClusterProfile, ProfileError, load
from ..command_line import ArgumentParser
from ..options import ConfigError, bounded_float, bounded_int, float_list, parse_target

DEFAULT_MODES = ("sync", "esync-outer", "diloco", "async")
DEFAULT_RECIPES = ("nesterov", "lookahead")
#: devices whose speeds differ by less than this are not cut apart
SAME_SPEED = 1.05


def subsets(profile: ClusterProfile, batch: int, most: int) -> list[int]:
    """How many of the fastest devices each candidate subset keeps (step 1): all, then each
    cut between two devices of different speed, largest first, at least 2, at most `most`."""
    times = sorted(d.seconds(batch) for d in profile.devices)
    cuts = [k for k in range(2, len(times)) if times[k] > times[k - 1] * SAME_SPEED]
    return [len(times)] + sorted(cuts, reverse=True)[:max(most - 1, 0)]


def fastest_of(profile: ClusterProfile, count: int, batch: int) -> ClusterProfile:
    """The profile of its `count` fastest devices (ties by order)."""
    order = sorted(range(len(profile.devices)),
                   key=lambda i: (profile.devices[i].seconds(batch), i))[:count]
    return ClusterProfile(tuple(profile.devices[i] for i in sorted(order)), profile.link,
                          profile.jitter, profile.source)


def capacity(profile: ClusterProfile, batch: int) -> float:
    """Its devices' summed speed (samples per second at `batch`) over the fastest's."""
    times = [d.seconds(batch) for d in profile.devices]
    return sum(min(times) / t for t in times)


@dataclass
class Candidate:
    scheme: str
    devices: int
    lr: float
    run_dir: str | None
    tta: float | None
    final: float | None
    capacity: float
    vs_fastest: float | None = None
    vs_sync: float | None = None

    @property
    def efficiency(self) -> float | None:
        return None if self.vs_fastest is None else self.vs_fastest / self.capacity


def rank(candidates: list[Candidate], higher_is_better: bool) -> list[Candidate]:
    """Those that reach the target first, soonest first; then the rest, best final first."""
    def key(c: Candidate):
        final = c.final if c.final is not None else (-math.inf if higher_is_better else math.inf)
        return (c.tta is None, c.tta or 0.0, -final if higher_is_better else final)
    return sorted(candidates, key=key)


def _bench_argv(args, profile_path: Path, name: str, alone: bool) -> list[str]:
    """`hetsync bench`'s arguments: the modes on the devices of `profile_path`, or (`alone`)
    the fastest device's recipes on the one device it holds."""
    argv = ["--profile", str(profile_path), "--modes", "" if alone else ",".join(args.modes),
            "--baselines", "", "--reference", ",".join(args.reference) if alone else "",
            "--time-budget", str(args.budget), "--targets", str(args.target),
            "--eval-interval", str(args.eval_interval), "--name", name,
            "--log-dir", str(Path(args.out) / "runs"), "--results-dir", str(args.out),
            "-n", args.network, "--dataset", args.dataset, "-b", str(args.batch_size),
            "--seed", str(args.seed), "--repeats", str(args.repeats)]
    if args.data_dir:
        argv += ["--data-dir", args.data_dir]
    if args.lr_sweep:
        argv += ["--lr-sweep", ",".join(map(str, args.lr_sweep)),
                 "--sweep-budget", str(args.budget)]
    if args.link_bandwidth:
        argv += ["--link-bandwidth", args.link_bandwidth]
    return argv


def advise(args, stream=sys.stdout) -> int:
    from ..bench import modes as bench
    from ..telemetry.metric import metric_of

    try:
        profile = load(args.profile)
    except ProfileError as err:
        raise ConfigError(f"PROFILE: {err}") from None
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"-o/--out: {out} already exists and is not empty; choose another")
    (out / "profiles").mkdir(parents=True, exist_ok=True)
    metric = metric_of(args.dataset)
    sizes = subsets(profile, args.batch_size, args.subsets)
    print(f"advise: {len(profile.devices)} devices of {args.profile}; subsets of "
          f"{', '.join(map(str, sizes))} fastest, and the fastest alone; schemes "
          f"{', '.join(args.modes)}; {args.budget:g} virtual s each", file=stream, flush=True)
    docs = {}
    for k, size in enumerate([*sizes, 1], 1):
        # (the fastest device by itself computes alone on its host: `Device.alone`)
        alone = k > len(sizes)
        part = fastest_of(profile, size, args.batch_size)
        if alone:
            part = ClusterProfile((part.devices[0].by_itself(),), part.link, part.jitter,
                                  part.source, part.model)
        path = out / "profiles" / ("fastest-alone.json" if alone else f"fastest-{size}.json")
        part.save(path)
        print(f"advise: [{k}/{len(sizes) + 1}] "
              + ("the fastest device alone" if alone else f"the {size} fastest device(s)"),
              file=stream, flush=True)
        name = "fastest-alone" if alone else f"devices-{size}"
        if bench.main(_bench_argv(args, path, name, alone)) == 2:
            return 2
        docs["alone" if alone else size] = json.loads((out / f"bench-{name}.json").read_text())
    return report(args, profile, docs, metric, stream)


def report(args, profile: ClusterProfile, docs: dict, metric, stream) -> int:
    from ..clock import all_reduce_seconds
    from ..telemetry.plots import plot_runs

    key = str(float(args.target))
    first = docs[max(size for size in docs if size != "alone")]
    fastest = (docs.get("alone") or {}).get("fastest_device") or {}
    best = (fastest.get("best") or {}).get(key)
    device_tta = best[1] if best else None
    sync = next((r for r in first["runs"] if r["label"] == "sync"), None)
    sync_tta = sync and sync["summary"] and sync["summary"]["time_to_target"].get(key)
    final_key = f"final_{metric.short}"
    candidates = []
    for size, doc in docs.items():
        cap = (1.0 if size == "alone" else
               capacity(fastest_of(profile, size, args.batch_size), args.batch_size))
        for r in doc["runs"]:
            s = r["summary"] or {}
            tta = (s.get("time_to_target") or {}).get(key)
            alone = r["kind"] == "reference"
            c = Candidate(("fastest device alone, " + r["label"].removeprefix("fastest-"))
                          if alone else r["label"], 1 if alone else size, r["lr"],
                          r["run_dir"], tta, s.get(final_key), 1.0 if alone else cap)
            if tta and device_tta:
                c.vs_fastest = device_tta / tta
            if tta and sync_tta:
                c.vs_sync = sync_tta / tta
            candidates.append(c)
    ranked = rank(candidates, metric.higher_is_better)
    if all(c.final is None for c in ranked):
        errors = sorted({r.get("error") or "no evaluation" for doc in docs.values()
                         for r in doc["runs"]})
        print(f"advise: no candidate completed a run, so there is nothing to rank: "
              f"{'; '.join(e.splitlines()[0] for e in errors)}", file=stream, flush=True)
        return 1
    head = ["#", "scheme", "devices", "lr", f"time to {args.target:g}", f"final {metric.short}",
            "x fastest alone", "x sync (all)", "capacity", "efficiency"]
    fmt = lambda x, f: "—" if x is None else format(x, f)  # noqa: E731
    rows = [[str(i), c.scheme, f"{c.devices} of {len(profile.devices)}", f"{c.lr:g}",
             fmt(c.tta, ".1f") + (" s" if c.tta is not None else ""), fmt(c.final, ".4f"),
             fmt(c.vs_fastest, ".2f"), fmt(c.vs_sync, ".2f"), f"{c.capacity:.2f}",
             fmt(c.efficiency, ".2f")] for i, c in enumerate(ranked, 1)]
    winner = ranked[0]
    why = _why(args, profile, winner, ranked, all_reduce_seconds)
    settings = _settings(args, winner)
    lines = [f"# hetsync advise: {args.profile}", "",
             f"Command: `hetsync {shlex.join(sys.argv[1:])}`", "",
             f"{len(profile.devices)} devices ({profile.source or 'no source given'}); "
             f"{args.network} on {args.dataset}, batch {args.batch_size}; each candidate "
             f"{args.budget:g} virtual s, seed {args.seed}"
             + (f", median of {args.repeats}" if args.repeats > 1 else "")
             + f"; {time.strftime('%Y-%m-%d %H:%M')}.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += ["", why, "", "The winner's settings:", "", "```", *settings, "```", "",
              f"A prediction from {args.budget:g} virtual seconds each: a longer run can "
              f"reorder schemes whose curves cross later (run `hetsync bench --profile` at "
              f"your own horizon to check)."]
    out = Path(args.out)
    (out / "advice.md").write_text("\n".join(lines) + "\n")
    (out / "advice.json").write_text(json.dumps({
        "profile": str(args.profile), "target": args.target, "budget": args.budget,
        "ranked": [{**c.__dict__, "efficiency": c.efficiency} for c in ranked],
        "why": why, "settings": settings}, indent=2) + "\n")
    drawn = [c for c in ranked[:6] if c.run_dir and c.devices > 1]
    reference = next((c for c in ranked if c.devices == 1 and c.run_dir), None)
    figures = []
    if drawn:
        figures = plot_runs([c.run_dir for c in drawn], out / "figures",
                            labels=[f"{c.scheme} on {c.devices}" for c in drawn],
                            sequential=reference and reference.run_dir,
                            sequential_label=reference and reference.scheme,
                            target=args.target, speedup=False)
    print("\n" + "\n".join(lines[6:]), file=stream)
    print(f"\nadvice: {out / 'advice.md'}\nfigures: {out / 'figures'} "
          f"({len(figures)} drawn)", file=stream, flush=True)
    return 0


def _why(args, profile: ClusterProfile, winner: Candidate, ranked: list[Candidate],
         all_reduce_seconds) -> str:
    """One paragraph: what won, and when it is the fastest device alone, why."""
    if winner.devices > 1:
        return (f"Best: {winner.scheme} on the {winner.devices} fastest devices"
                + (f", {winner.vs_fastest:.2f}x sooner than the fastest device alone at its "
                   f"best ({winner.efficiency:.2f} of the ideal cluster of its capacity "
                   f"{winner.capacity:.2f})" if winner.vs_fastest else "") + ".")
    from ..config import Config

    cfg = Config(network=args.network, dataset=args.dataset, data_dir=args.data_dir)
    numel = sum(p.numel() for p in cfg.build_model(cfg.load_data()).parameters())
    step = min(d.seconds(args.batch_size) for d in profile.devices)
    link = profile.slowest_link
    if args.link_bandwidth:
        from ..clock import Link, parse_rate

        link = Link(link.latency_s, parse_rate(args.link_bandwidth))
    cluster = next((c for c in ranked if c.devices > 1), None)
    total = len(profile.devices)
    one_sum = all_reduce_seconds("native", total, 4 * numel, link)
    if one_sum > step:
        reason = (f"one sum of the model ({4 * numel / 1e6:.2f} MB) over {total} devices costs "
                  f"{1000 * one_sum:.1f} ms on these links ({link.describe()}), "
                  f"{one_sum / step:.1f}x the fastest device's step ({1000 * step:.2f} ms): "
                  f"the links are too slow for the devices")
    else:
        reason = (f"a sum costs only {one_sum / step:.2f} of its step, but the other devices "
                  f"add {cluster.capacity - 1:.2f}x its speed and the best scheme on them "
                  f"({cluster.scheme} on {cluster.devices}) "
                  + ("missed the target" if cluster.tta is None else
                     f"reached it {cluster.tta:.1f} s in") + ": their updates cost more "
                  f"than their speed adds" if cluster else "no cluster scheme completed")
    return f"Use your fastest device alone ({winner.scheme}): {reason}."


def _settings(args, winner: Candidate) -> list[str]:
    budget = f"--time-budget {args.budget:g} --epochs none --lr-schedule cosine"
    common = (f"-n {args.network} --dataset {args.dataset} -b {args.batch_size} "
              f"--learning-rate {winner.lr:g}")
    if winner.devices == 1:
        recipe = winner.scheme.split(", ", 1)[-1]
        from .modes import RECIPES

        mode, changes = RECIPES[recipe]
        extra = " ".join(f"--{k.replace('_', '-')} {int(v) if isinstance(v, bool) else v}"
                         for k, v in changes.items())
        return [f"# the fastest device alone ({recipe}):",
                f"hetsync worker -m {mode} --workers 1 {common} {extra} {budget}"]
    return [f"# on the virtual clock, this profile's {winner.devices} fastest devices:",
            f"hetsync launch --profile {Path(args.out) / 'profiles'}/fastest-{winner.devices}"
            f".json -m {winner.scheme} {common} {budget}",
            f"# on the real devices ({winner.devices} processes, one per device):",
            f"torchrun --nproc-per-node {winner.devices} -m hetsync worker -m {winner.scheme} "
            f"--workers {winner.devices} {common} {budget}",
            "# or in your own loop:",
            f"optimizer = hetsync.wrap(torch.optim.SGD(model.parameters(), lr={winner.lr:g}), "
            f"model, mode={winner.scheme!r})"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..algorithms import registry

    p.add_argument("profile", metavar="PROFILE", help="a cluster profile (hetsync probe's)")
    p.add_argument("--modes", type=_modes(registry.names(baseline=False)),
                   default=DEFAULT_MODES,
                   help=f"the schemes to compare (default: {','.join(DEFAULT_MODES)})")
    p.add_argument("--reference", type=_modes(("sgd", "nesterov", "adamw", "lookahead")),
                   default=DEFAULT_RECIPES, help="the fastest device's recipes (default: "
                   f"{','.join(DEFAULT_RECIPES)})")
    p.add_argument("--budget", type=bounded_float(0, 3600, "seconds"), default=10.0,
                   help="virtual seconds of training per candidate (default: 10)")
    p.add_argument("--target", type=parse_target, default=None,
                   help="the accuracy (or validation loss) to reach (default: 0.85, or 2.2 "
                   "for a text data set)")
    p.add_argument("--subsets", type=bounded_int(1, 16, "a number of subsets"), default=2,
                   help="device subsets to try besides the fastest alone: all, then all but "
                   "the slowest, ... (default: 2)")
    p.add_argument("--lr-sweep", type=float_list(0, what="learning rates"), default=None,
                   help="rates to try per scheme (the best is used; default: linear scaling)")
    p.add_argument("--repeats", type=bounded_int(1, 10, "a number of seeds"), default=1,
                   help="seeds per candidate (default: 1)")
    p.add_argument("--seed", type=bounded_int(0, 2 ** 31 - 1, "a seed"), default=0)
    p.add_argument("-n", "--network", default="lenet", help="the zoo's model (default: lenet)")
    p.add_argument("--dataset", default="fashion-mnist", help="its data (default: fashion-mnist)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("-b", "--batch-size", type=bounded_int(1, 1 << 16, "a batch size"),
                   default=64, help="each device's batch (default: 64)")
    p.add_argument("--eval-interval", type=bounded_float(0, 3600, "seconds"), default=1.0,
                   help="virtual seconds between evaluations (default: 1)")
    p.add_argument("--link-bandwidth", default=None,
                   help="price the links at this rate instead of the profile's (e.g. 100mbit)")
    p.add_argument("-o", "--out", default=None,
                   help="where the advice, runs and figures go (default: advise-DATE-TIME)")


def _modes(valid: Sequence[str]):
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(x.strip() for x in text.split(",") if x.strip())
        bad = [n for n in names if n not in valid]
        if not names or bad:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}; expected names from "
                                             f"{', '.join(valid)}")
        return names
    return parse


def options(args) -> argparse.Namespace:
    """`args` with its defaults filled in (the target by the data set's figure)."""
    from ..telemetry.metric import metric_of

    metric = metric_of(args.dataset) if args.dataset else None
    if args.target is None:
        args.target = 0.85 if metric is None or metric.higher_is_better else 2.2
    args.out = args.out or time.strftime("advise-%Y%m%d-%H%M%S")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    p = ArgumentParser(prog="hetsync advise", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    args = options(p.parse_args(argv))
    try:
        return advise(args)
    except ConfigError as err:
        print(f"hetsync advise: error: {err}", file=sys.stderr)
        return 2
