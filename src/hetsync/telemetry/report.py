"""Tables printed for people: one run's summary, and the comparison of several runs."""

from __future__ import annotations

import sys
from typing import Any, Mapping, Sequence

from hetsync.telemetry.metric import ACCURACY, LOSS, bits, metric_of_summary


def _num(value: Any, fmt: str, missing: str = "—") -> str:
    return missing if value is None else format(value, fmt)


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table: first column left-aligned, the others right-aligned."""
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(str(h))
              for i, h in enumerate(headers)]

    def line(cells):
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(headers), line("-" * w for w in widths)] + [line(r) for r in rows])


def _joins(s: Mapping[str, Any]) -> str:
    """What the run's joins were: spares that joined (and never did), lost ranks again."""
    spares, joins = set(s.get("spare_workers") or ()), s.get("joined_workers") or []
    joined = list(dict.fromkeys(joins))
    late = [r for r in joined if r in spares]
    again = [r for r in joined if r not in spares or joins.count(r) > 1]
    return ((f"; spare rank {', '.join(map(str, late))} joined" if late else "")
            + (f"; spare rank {', '.join(map(str, s['absent_workers']))} never joined"
               if s.get("absent_workers") else "")
            + (f"; rank {', '.join(map(str, again))} lost and joined again" if again else ""))


def print_summary(summary: Mapping[str, Any], stream=None) -> None:
    s, stream = summary, stream or sys.stdout
    slow = ",".join(f"{x:g}" for x in s.get("slowdowns") or [])
    scale = s.get("speed_scale") or 1.0
    print(f"\nrun {s['run_name']}: {s['mode']}, {s['workers']} worker(s)"
          + (f", slowdowns {slow}" if slow else "")
          + (f" x {scale:.4g}" if slow and scale != 1 else "")
          + f", {s.get('network')}, collective {s.get('collective')}, lr {s.get('lr')}"
          + (f" ({s['lr_schedule']})" if s.get("lr_schedule", "constant") != "constant" else "")
          + (f"; went on without rank {', '.join(map(str, s['lost_workers']))}"
             if s.get("lost_workers") else "")
          + _joins(s),
          file=stream)
    metric = metric_of_summary(s)
    tta = "  ".join(f"{k}: {_num(v, '.1f')}s" for k, v in s["time_to_target"].items())
    print(f"wall {s['wall_s']:.1f} s | {s['samples']:,} samples | throughput "
          f"{_num(s['throughput'], ',.0f')} samples/s | utilisation "
          f"{_num(s['utilisation'], '.2f')} of {_num(s['throughput_limit'], ',.0f')} | traffic "
          f"{_num(s['traffic_Bps'] and s['traffic_Bps'] / 1e6, '.2f')} MB/s", file=stream)
    clock = s.get("clock") or {}
    if clock.get("kind") == "virtual":
        from hetsync.clock import Link

        link = Link(clock["latency_s"], clock["bandwidth_bps"])
        print(f"virtual clock: every time above is modelled ("
              + (f"devices of profile {clock['profile']}, " if clock.get("profile") else "")
              + f"links {link.describe()}, step jitter {clock.get('step_jitter', 0):g}"
              + (f" {clock.get('jitter_distribution', 'lognormal')}"
                 if clock.get("step_jitter") else "")
              + ", reference step "
              f"{1000 * (clock.get('step_work') or 0):.2f} ms); {s['wall_s']:.1f} virtual s "
              f"in {clock.get('real_s', 0):.1f} real s ("
              f"{s['wall_s'] / max(clock.get('real_s') or 0, 1e-9):.2f} virtual s per real s)",
              file=stream)
    print(f"time to {metric.short} {'>=' if metric.higher_is_better else '<='} {tta}",
          file=stream)
    final = (f"final loss {_num(s['final_loss'], '.4f')} ({_num(bits(s['final_loss']), '.3f')} "
             f"bits per character; best {_num(s['best_loss'], '.4f')}), next-character accuracy "
             f"{_num(s['final_accuracy'], '.4f')}" if metric is LOSS else
             f"final accuracy {_num(s['final_accuracy'], '.4f')} (best "
             f"{_num(s['best_accuracy'], '.4f')})")
    print(f"{final} after {s['rounds']} rounds"
          + (f" | synchronised steps {s['synced_fraction']:.1%}"
             if s.get("synced_fraction") is not None else ""), file=stream)
    if s.get("ledger"):
        led = s["ledger"]
        units = "sample(s)" if led.get("unit") == "sample" else "batch(es)"
        print(f"data ledger: {led['batches_twice']} {units} drawn twice, "
              f"{led['batches_skipped']} skipped"
              + "".join(f"; rank {r}: {w['batches_left_in_last_epoch']} of epoch "
                        f"{w['epochs'] - 1}'s {w['epoch_batches']} not drawn"
                        for r, w in led["per_worker"].items()
                        if w["batches_left_in_last_epoch"] and int(r) in
                        set(s.get("lost_workers") or ()) and w.get("drawn_by") == [int(r)])
              + "".join(f"; rank {r}'s shard drawn by rank(s) "
                        f"{', '.join(str(b) for b in w['drawn_by'] if b != int(r))} too"
                        for r, w in led["per_worker"].items()
                        if len(w.get("drawn_by", ())) > 1), file=stream)
    stale = [w["mean_staleness"] for w in s["per_worker"] if w.get("mean_staleness") is not None]
    if stale:
        print("mean staleness of each worker's gradients (rounds) "
              + " ".join(f"{x:.2f}" for x in stale), file=stream)
    rows = [[str(w["rank"]), w["device"], f"{w['slowdown']:g}", str(w["rounds"]),
             str(w["local_steps"]), f"{w['samples']:,}", f"{w['compute_s']:.1f}",
             f"{w['wait_s']:.1f}", f"{w['comm_s']:.1f}", f"{w['eval_s']:.1f}",
             _num(w["computing_time_ratio"], ".2f"),
             _num(w["bytes_sent"] / max(w["rounds"], 1) / 1e3, ",.1f"),
             _num(w.get("isolated_throughput"), ",.0f")
             + ("" if w.get("speed_of_nominal") is None
                else f" ({w['speed_of_nominal']:.0%} of {w['nominal_speed']:,.0f})")]
            for w in s["per_worker"]]
    print(table(["rank", "device", "slowdown", "rounds", "steps", "samples", "compute s",
                 "wait s", "comm s", "eval s", "compute ratio", "kB sent/round",
                 "samples per compute s (of nominal)"], rows),
          file=stream)
    for warning in s.get("warnings") or []:
        print(f"warning: {warning}", file=stream)


def print_comparison(summaries: Mapping[str, Mapping[str, Any]], speedups: Mapping[str, Any],
                     lrs: Mapping[str, Any] | None = None, stream=None) -> None:
    """One row per run: time-to-target per target, speedup vs sync, the final accuracy or
    loss, throughput..."""
    stream = stream or sys.stdout
    targets = list(next(iter(summaries.values()))["time_to_target"]) if summaries else []
    metric = metric_of_summary(next(iter(summaries.values()))) if summaries else ACCURACY
    rows = []
    for name, s in summaries.items():
        rows.append([name, str((lrs or {}).get(name, s.get("lr")))]
                    + [_num(s["time_to_target"].get(t), ".1f") for t in targets]
                    + [_num(speedups.get(name), ".2f"), _num(s[f"final_{metric.short}"], ".4f"),
                       _num(s["throughput"], ",.0f"), _num(s["utilisation"], ".2f"),
                       _num(s["traffic_Bps"] and s["traffic_Bps"] / 1e6, ".2f")])
    print(table(["run", "lr"] + [f"tta {t} (s)" for t in targets]
                + ["speedup", f"final {metric.short}", "samples/s", "utilisation", "MB/s"], rows),
          file=stream)
