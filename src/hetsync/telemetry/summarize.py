"""The figures of a run (docs/design.md, "Definitions of the figures"), computed from its run directory.

Every figure is a pure function of the records read by :mod:`hetsync.telemetry.runlog`;
:func:`summarize` composes them into the dict written as ``summary.json``, and
:func:`esync_summary` rewrites the records in ESync's original ``summary.py`` schema so its
plotting tools can read a hetsync run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from hetsync.telemetry.ledger import run_ledger
from hetsync.telemetry.metric import ACCURACY, Metric, metric_of
from hetsync.telemetry.runlog import ROUND_FIELDS, RunLog, read_run
from hetsync.telemetry.recorder import clean_json, write_text_atomic
from hetsync.telemetry.rundir import RunDir

__all__ = [
    "target_key",
    "run_wall_time",
    "worker_stats",
    "traffic",
    "time_to_target",
    "summarize_log",
    "summarize",
    "speedup",
    "esync_device_names",
    "esync_summary",
    "write_summary",
]

#: an emulated device measured below this fraction of its nominal speed did not keep it
HELD = 0.9


def target_key(target: float) -> str:
    """The key of ``target`` in ``time_to_target``: ``str(float(target))``, e.g. ``"0.8"``."""
    return str(float(target))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def run_wall_time(run: Mapping[str, Any], workers: Mapping[int, Sequence[Mapping]], evals: Sequence[Mapping]) -> float:
    """Run wall time (s): ``run.json``'s ``wall_s`` when present (the run ended normally), else
    the latest time recorded anywhere, max over every worker record's ``t_end`` and every
    evaluation's ``t`` (0 when nothing was recorded)."""
    if run.get("wall_s") is not None:
        return float(run["wall_s"])
    ends = [float(r["t_end"]) for records in workers.values() for r in records]
    ends += [float(e["t"]) for e in evals if e.get("t") is not None]
    return max(ends, default=0.0)


def worker_stats(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One worker's totals and ratios over its round records.

    - ``rounds`` = number of records; ``local_steps``, ``samples``, ``compute_s``, ``wait_s``,
      ``comm_s``, ``eval_s``, ``query_s``, ``bytes_sent``, ``bytes_recv`` = sums;
    - ``wall_s`` = last ``t_end`` − first ``t_start``;
    - ``computing_time_ratio`` = compute_s ÷ (wall_s − eval_s): evaluating is neither computing
      nor training, so it is taken out of the worker's time;
    - ``throughput`` = samples ÷ wall_s (samples/s);
    - ``isolated_throughput`` = samples ÷ compute_s: the rate the worker, slowdown included,
      would train at if it never waited or communicated (its measured speed, beside the
      nominal speed of its emulated device);
    - ``mean_FIELD`` for every number the mode adds to its records (`Mode.round_record`):
      its mean over the rounds that have it — e.g. ``mean_synced``, the fraction of SelSync's
      steps that synchronised, ``mean_staleness``, eager-SGD's rounds between a gradient's
      model and the round that carried it.

    Ratios are ``None`` when their denominator is not positive.
    """
    def total(key: str) -> float:
        return float(sum(float(r.get(key) or 0.0) for r in records))

    samples = int(sum(int(r["samples"]) for r in records))
    compute_s, eval_s = total("compute_s"), total("eval_s")
    wall = (max(float(r["t_end"]) for r in records) - min(float(r["t_start"]) for r in records)) if records else 0.0
    optional = {}
    for key in sorted({k for r in records for k in r} - ROUND_FIELDS):
        values = [float(r[key]) for r in records if _number(r.get(key))]
        if values:
            optional[f"mean_{key}"] = sum(values) / len(values)
    return {
        "rounds": len(records),
        "local_steps": int(sum(int(r["local_steps"]) for r in records)),
        "samples": samples,
        "compute_s": compute_s,
        "wait_s": total("wait_s"),
        "comm_s": total("comm_s"),
        "eval_s": eval_s,
        "query_s": total("query_s"),
        "bytes_sent": int(total("bytes_sent")),
        "bytes_recv": int(total("bytes_recv")),
        "wall_s": wall,
        "computing_time_ratio": _ratio(compute_s, wall - eval_s),
        "throughput": _ratio(samples, wall),
        "isolated_throughput": _ratio(samples, compute_s),
        **optional,
    }


def traffic(
    workers: Mapping[int, Sequence[Mapping[str, Any]]],
    ps: Sequence[Mapping[str, Any]],
    service: Mapping[str, Any] | None,
    wall_s: float,
) -> dict[str, Any]:
    """Bytes sent by every process, counted at the transport.

    - ``bytes_sent_total`` = Σ workers' bytes_sent + the parameter server's (last, cumulative
      ``ps.jsonl`` record) + the mode's service's (``service.json``); ``bytes_recv_total``
      likewise;
    - ``traffic_Bps`` = bytes_sent_total ÷ run wall time (bytes/s);
    - ``bytes_per_worker_round`` = Σ workers' bytes_sent ÷ Σ workers' number of rounds.
    """
    def last(key: str) -> int:
        return int(ps[-1].get(key) or 0) if ps else 0

    def server(key: str) -> int:
        return int((service or {}).get(key) or 0)

    w_sent = int(sum(float(r["bytes_sent"]) for records in workers.values() for r in records))
    w_recv = int(sum(float(r["bytes_recv"]) for records in workers.values() for r in records))
    rounds = sum(len(records) for records in workers.values())
    sent = w_sent + last("bytes_sent") + server("bytes_sent")
    return {
        "bytes_sent_total": sent,
        "bytes_recv_total": w_recv + last("bytes_recv") + server("bytes_recv"),
        "bytes_sent_workers": w_sent,
        "bytes_sent_ps": last("bytes_sent"),
        "bytes_sent_service": server("bytes_sent"),
        "service_requests": (service or {}).get("requests"),
        "traffic_Bps": _ratio(sent, wall_s),
        "bytes_per_worker_round": _ratio(w_sent, rounds),
    }


def time_to_target(evals: Sequence[Mapping[str, Any]], targets: Iterable[float],
                   metric: Metric = ACCURACY) -> dict[str, float | None]:
    """{target_key(a): ``train_time`` of the first evaluation (in training-time order) whose
    ``metric`` reached a (accuracy ≥ a, loss ≤ a), or ``None`` when none did}.

    ``train_time`` excludes all time spent evaluating, so evaluating more often does not make a
    mode look slower.
    """
    ordered = sorted((e for e in evals if metric.of(e) is not None),
                     key=lambda e: float(e["train_time"]))
    result: dict[str, float | None] = {}
    for a in targets:
        hit = next((e for e in ordered if metric.reached(metric.of(e), a)), None)
        result[target_key(a)] = float(hit["train_time"]) if hit else None
    return result


def summarize_log(log: RunLog, targets: Iterable[float] | None = None) -> dict[str, Any]:
    """The summary of one run (the content of ``summary.json``); see :func:`summarize`."""
    run, config = log.run, log.config
    metric = metric_of(config.get("dataset"))
    targets = metric.default_targets if targets is None else tuple(targets)
    wall = run_wall_time(run, log.workers, log.evals)
    # Evaluation pauses that stopped every worker (collective modes) are not training time.
    train_wall = wall - float(run.get("paused_s") or 0.0)
    per_worker = []
    for rank in sorted(log.workers):
        info = log.rank_info(rank)
        stats = worker_stats(log.workers[rank])
        nominal = info.get("nominal_speed")
        per_worker.append({
            "rank": rank,
            "host": info["host"],
            "device": info["device"],
            "slowdown": float(info["slowdown"]),
            "nominal_speed": nominal,
            **stats,
            "speed_of_nominal": (_ratio(stats["isolated_throughput"], nominal)
                                 if nominal and stats["isolated_throughput"] else None),
        })
    samples = sum(w["samples"] for w in per_worker)
    throughput = _ratio(samples, train_wall)
    declared = [int(r["rank"]) for r in run.get("ranks") or []  # workers, not the parameter server
                if "rank" in r and r.get("role", "worker") == "worker"]
    # (--spare-workers: the ranks the run started without; none after a resume)
    spares = [int(r["rank"]) for r in run.get("ranks") or [] if r.get("spare")]
    joined = run.get("joined_workers") or (log.ps[-1].get("rejoined", []) if log.ps else [])
    partial = set(run.get("lost_workers", [])) | set(joined) | set(spares)
    for w in per_worker:
        w["present_fraction"] = (present_fraction(log.workers[w["rank"]], train_wall)
                                 if w["rank"] in partial else 1.0)
    isolated = [w["isolated_throughput"] * w["present_fraction"] for w in per_worker
                if w["isolated_throughput"] is not None]
    limit = float(sum(isolated)) if isolated else None
    absent = [int(r) for r in run.get("absent_workers")  # (asynchronous: the server's)
              or (log.ps[-1].get("absent") or [] if log.ps else [])]
    rounds = [int(r["round"]) for records in log.workers.values() for r in records]
    evals = [e for e in log.evals if e.get("test_acc") is not None]
    slowdowns = list(config.get("slowdowns") or [])
    if len(slowdowns) < len(per_worker):  # an empty or short list leaves the rest at 1
        slowdowns = [w["slowdown"] for w in per_worker]

    return {
        "run_name": run.get("run_name", log.run_dir.name),
        "mode": log.mode,
        "workers": run.get("workers", config.get("workers", len(per_worker))),
        "slowdowns": [float(s) for s in slowdowns],
        "lr": config.get("lr"),
        "lr_schedule": config.get("lr_schedule", "constant"),
        "batch_size": config.get("batch_size"),
        "network": config.get("network"),
        "collective": config.get("collective"),
        "complete": run.get("end_time") is not None,
        "lost_workers": run.get("lost_workers", []),
        # (an asynchronous mode's: those its parameter server served again)
        "joined_workers": joined,
        "spare_workers": spares,
        "absent_workers": absent,
        "wall_s": wall,
        "rounds": max(rounds, default=0),
        "samples": samples,
        "throughput": throughput,
        "throughput_limit": limit,
        "utilisation": _ratio(throughput, limit) if throughput is not None and limit else None,
        "paused_s": wall - train_wall,
        **traffic(log.workers, log.ps, log.service, train_wall),
        "evaluations": len(evals),
        "ledger": run_ledger(log.workers),
        "metric": metric.key,
        "time_to_target": time_to_target(evals, targets, metric),
        "final_accuracy": float(evals[-1]["test_acc"]) if evals else None,
        "best_accuracy": max((float(e["test_acc"]) for e in evals), default=None),
        "final_loss": (float(evals[-1]["test_loss"]) if evals and evals[-1].get("test_loss") is not None else None),
        "best_loss": min((float(e["test_loss"]) for e in evals if e.get("test_loss") is not None),
                         default=None),
        "missing_workers": sorted(set(declared) - set(log.workers) - set(absent)),
        "synced_fraction": per_worker[0].get("mean_synced") if per_worker else None,
        "speed_scale": float(config.get("speed_scale") or 1.0),
        "step_work": config.get("step_work"),
        # what timed the run (`hetsync.clock`): on a virtual clock, what it modelled
        "clock": run.get("clock") or {"kind": "wall"},
        "warnings": emulation_warnings(per_worker),
        "per_worker": per_worker,
    }


def emulation_warnings(per_worker: Sequence[Mapping[str, Any]]) -> list[str]:
    """A line for each emulated device that ran below HELD of its nominal speed (samples per
    second of computing; `runtime/emulation.py`)."""
    return [f"rank {w['rank']} (slowdown {w['slowdown']:g}) ran at {w['speed_of_nominal']:.0%} "
            f"of its nominal speed ({w['isolated_throughput']:,.0f} of "
            f"{w['nominal_speed']:,.0f} samples per second of computing): the emulated "
            f"device did not keep its speed (the machine was busy, or oversubscribed)"
            for w in per_worker
            if w.get("speed_of_nominal") is not None and w["speed_of_nominal"] < HELD]


def present_fraction(records: list[dict[str, Any]], train_wall: float) -> float:
    """The part of the run's training time a worker took part in: its rounds' durations ÷
    `train_wall`, at most 1 (a spare that joined late, a worker lost or away a while)."""
    present = sum(float(r["t_end"]) - float(r["t_start"]) for r in records)
    return min(1.0, present / train_wall) if train_wall > 0 else 1.0


def summarize(run_dir: str | Path, targets: Iterable[float] | None = None) -> dict[str, Any]:
    """Read ``run_dir`` and compute its figures (docs/design.md, "Definitions of the figures").

    Keys: ``run_name, mode, workers, slowdowns, lr, batch_size, network, collective`` (from
    run.json/config; ``slowdowns`` is per worker, 1 where the config's list is short); ``complete`` (run.json has ``end_time``); ``wall_s`` (see
    :func:`run_wall_time`); ``rounds`` (max round number); ``samples`` (Σ over workers);
    ``throughput`` = samples ÷ (wall_s − paused_s), where ``paused_s`` (run.json) is the time
    every worker stood still for an evaluation (collective modes; traffic uses the same
    denominator); ``throughput_limit`` = Σ workers' isolated throughput, each times its
    ``present_fraction`` (1; for a worker lost, joined or a spare, :func:`present_fraction`);
    ``utilisation`` = throughput ÷ throughput_limit; the traffic keys of :func:`traffic`;
    ``evaluations``; ``ledger`` (:func:`~hetsync.telemetry.ledger.run_ledger`: batches of
    the workers' shards drawn twice or skipped, per shard and in all; None where the
    records name no draws, as `hetsync.wrap`'s); ``metric``, the evaluation record's key the run is judged by (test
    accuracy; validation loss for language modelling: :mod:`hetsync.telemetry.metric`) and
    ``time_to_target`` (:func:`time_to_target`, at ``targets``, by default the metric's);
    ``final_accuracy`` and ``final_loss`` (last evaluation), ``best_accuracy``,
    ``best_loss``; ``missing_workers`` (worker ranks in run.json, i.e. not ``role:
    parameter-server``, with no worker file, less the spares that never joined);
    ``spare_workers`` (`--spare-workers`: the ranks the run started without) and
    ``absent_workers`` (those of them that never joined); ``per_worker``: one dict per
    rank, sorted by rank, with ``rank, host, device, slowdown, nominal_speed`` (run.json's:
    samples per second of computing of its emulated device, or None), the keys of
    :func:`worker_stats` and ``speed_of_nominal`` = isolated_throughput ÷ nominal_speed;
    ``speed_scale``, ``step_work`` (the config's: `runtime/emulation.py`) and ``warnings``
    (:func:`emulation_warnings`).
    """
    return summarize_log(read_run(run_dir), targets)


#: The run every speedup is measured against (docs/design.md, "Definitions of the figures").
SPEEDUP_BASELINE = "sync"


def speedup(
    summaries: Mapping[str, Mapping[str, Any]], baseline: str = SPEEDUP_BASELINE,
    target: float = 0.8
) -> dict[str, float | None]:
    """Speedup of each run over ``baseline`` at ``target`` of the runs' metric:
    time-to-target(baseline) ÷ time-to-target(run).

    ``summaries`` maps a name to a :func:`summarize` result (which must hold ``target`` in its
    ``time_to_target``). A run that never reached the target gets ``None``; every run gets
    ``None`` when the baseline never reached it. Raises ``ValueError`` when ``baseline`` is not
    one of the names or a summary was computed without ``target``.
    """
    if baseline not in summaries:
        raise ValueError(f"baseline {baseline!r} is not among the runs {sorted(summaries)}")
    key = target_key(target)

    def tta(name: str) -> float | None:
        table = summaries[name].get("time_to_target") or {}
        if key not in table:
            raise ValueError(f"summary {name!r} has no time-to-target for target {target} (has {sorted(table)})")
        return table[key]

    base = tta(baseline)
    result: dict[str, float | None] = {}
    for name in summaries:
        own = tta(name)
        result[name] = base / own if base is not None and own else None
    return result


# --- ESync's original summary schema -------------------------------------------------------

def _esync_base_name(device: str) -> str:
    """ESync's device directory name: ``cpu`` for a CPU, ``gpu{i}`` for ``cuda:{i}``."""
    d = str(device).strip().lower()
    if d.startswith("cuda") or d.startswith("gpu"):
        index = d.split(":", 1)[1] if ":" in d else (d[3:] if d.startswith("gpu") else "")
        return f"gpu{index or 0}"
    if d.startswith("cpu"):
        return "cpu"
    return d.replace(":", "") or "device"


def esync_device_names(ranks: Sequence[Mapping[str, Any]]) -> dict[int, tuple[str, str]]:
    """rank → (node, device) as ESync names them: node = the rank's host; device = ``cpu`` or
    ``gpu{i}``, made unique per host by appending ``_1``, ``_2``… to later ranks with the same
    name (ESync ran at most one worker per device, hetsync's emulated clusters often run several
    on one CPU)."""
    used: dict[str, set[str]] = {}
    names: dict[int, tuple[str, str]] = {}
    for info in sorted(ranks, key=lambda r: int(r["rank"])):
        host = str(info.get("host") or "localhost")
        base = _esync_base_name(info.get("device") or "cpu")
        taken = used.setdefault(host, set())
        name, n = base, 0
        while name in taken:
            n += 1
            name = f"{base}_{n}"
        taken.add(name)
        names[int(info["rank"])] = (host, name)
    return names


def _aggregation_pass(log: RunLog) -> bool:
    """Whether the run's rounds ended with an aggregation pass that ESync's logs count as one
    more iteration (its mode's `Mode.aggregation_pass`, which run.json's `mode_info` records)."""
    return bool((log.run.get("mode_info") or {}).get("aggregation_pass", False))


def esync_summary(log: RunLog) -> dict[str, dict[str, dict[str, list]]]:
    """The run in ESync's ``summary.py`` schema ``{node: {device: {accuracy_list,
    num_samples_list, self_iters_list, elapsed_time_list, aggregate_time_list}}}``, one list
    entry per round, as ESync's ``summary.py`` builds from its ``iter-N.txt`` files:

    - ``accuracy_list``: test accuracy rounded to 3 dp of every evaluation, on rank 0 only
      (ESync evaluates on rank 0; the key is an empty list for the other ranks);
    - ``num_samples_list``: samples trained in the round;
    - ``self_iters_list``: number of entries in ESync's per-round ``time`` map: in ``esync``
      mode (a mode whose `aggregation_pass` is set) local_steps + 1 (the aggregation pass is
      an entry), otherwise local_steps;
    - ``elapsed_time_list``: ``int(round(t_end))``, seconds since the run started (ESync counted
      from its logger's creation);
    - ``aggregate_time_list``: ESync's ``global update``/``global aggregate`` time, rounded to
      4 dp: comm_s + wait_s − query_s (blocking in the aggregation; the queries of its plan were
      ESync's separate ``check ready`` entry).
    """
    ranks = [log.rank_info(rank) for rank in sorted(log.workers)]
    names = esync_device_names(ranks)
    esync_mode = _aggregation_pass(log)
    out: dict[str, dict[str, dict[str, list]]] = {}
    for rank in sorted(log.workers):
        node, device = names[rank]
        records = sorted(log.workers[rank], key=lambda r: (float(r["t_start"]), int(r["round"])))
        out.setdefault(node, {})[device] = {
            "accuracy_list": [round(float(e["test_acc"]), 3) for e in log.evals if e.get("test_acc") is not None]
            if rank == 0 else [],
            "num_samples_list": [int(r["samples"]) for r in records],
            "self_iters_list": [int(r["local_steps"]) + (1 if esync_mode else 0) for r in records],
            "elapsed_time_list": [int(round(float(r["t_end"]))) for r in records],
            "aggregate_time_list": [
                round(max(0.0, float(r["comm_s"]) + float(r["wait_s"]) - float(r.get("query_s") or 0.0)), 4)
                for r in records
            ],
        }
    return out


def _finite(data: Any) -> Any:
    """``data`` with every NaN/inf float replaced by ``None`` (a diverged run's loss), so the
    file is strict JSON."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(v) for v in data]
    return data


def _dump(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_finite(data), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    tmp.replace(path)


def write_summary(
    run_dir: str | Path, targets: Iterable[float] | None = None, esync_json: bool = False
) -> Path:
    """Write ``{run_dir}/summary.json`` (:func:`summarize`) and, with ``esync_json``, also
    ``{run_dir}/esync-summary.json`` (:func:`esync_summary`). Returns the summary.json path."""
    log = read_run(run_dir)
    path = RunDir(log.run_dir).summary
    _dump(path, summarize_log(log, targets))
    if esync_json:
        _dump(RunDir(log.run_dir).esync_summary, esync_summary(log))
    return path


def recount_samples_seen(run_dir: str | Path) -> None:
    """Restamp each evaluation's `samples_seen` of a finished run from the workers' records:
    the samples of every round that ended by the evaluation's time `t`.

    For the modes whose count goes through the store (no common round: the asynchronous
    ones) on a virtual clock: there the leader reads the store when the real machine gets to
    it, so its count depends on the machine's speed while every other field is the clocks'."""
    log = read_run(run_dir)
    ends = [(float(r["t_end"]), int(r["samples"])) for records in log.workers.values()
            for r in records]
    path = RunDir(run_dir).eval
    if not path.is_file():
        return
    evals = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for record in evals:  # (the leader's own round ends exactly at `t`)
        record["samples_seen"] = sum(n for t, n in ends if t <= record["t"] + 1e-9)
    write_text_atomic(path, "".join(json.dumps(clean_json(r), separators=(",", ":")) + "\n"
                                    for r in evals))
