"""One run's records from several machines into one run directory (`hetsync gather`).

Under torchrun every machine writes its own workers' records into its own `-ld/RUN_NAME/`;
rank 0's machine also writes `run.json` and `eval.jsonl`, the parameter server's `ps.jsonl`.
`gather(dest, sources)` copies them into `dest` (which may be one of the sources):

1. every source must hold records of the same run: their `run.json`s, where present, name
   the same run and start time;
2. a file present in several sources must be the same bytes there (the same rank's records
   written twice would be two runs mixed);
3. each file is copied to a temporary name and renamed, so an interrupted gather leaves whole
   files only;
4. `events.jsonl`, which every machine appends its own events to, is the sources' events
   merged in time order (each once).

It returns the names copied; `summarize` then warns about workers `run.json` lists that have
no records (a machine not gathered).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from hetsync.telemetry.recorder import write_text_atomic
from hetsync.telemetry.rundir import EVENTS, RECORDS, RUN, RunDir


class GatherError(ValueError):
    """The sources are not one run's records, or a file differs between them."""


def _identity(run_json: Path) -> tuple:
    try:
        run = json.loads(run_json.read_text())
    except (OSError, ValueError) as err:
        raise GatherError(f"{run_json}: cannot be read as JSON ({err})") from None
    return run.get("run_name"), run.get("start_time")


def gather(dest: str | Path, sources: list[str | Path]) -> list[str]:
    """Copy the records of `sources` into `dest` (see the module docstring)."""
    dest = Path(dest)
    found: dict[str, Path] = {}
    runs: dict[tuple, Path] = {}
    for source in map(Path, sources):
        if not source.is_dir():
            raise GatherError(f"{source}: not a directory")
        for path in sorted(source.iterdir()):
            if not RECORDS.match(path.name) or not path.is_file():
                continue
            if path.name == RUN:
                runs.setdefault(_identity(path), path)
            other = found.get(path.name)
            if other is None:
                found[path.name] = path
            elif other.read_bytes() != path.read_bytes() and path.name != RUN:
                raise GatherError(f"{path.name} differs between {other.parent} and "
                                  f"{path.parent}: records of two runs?")
    if len(runs) > 1:
        named = ", ".join(f"{name} started {start}" for name, start in runs)
        raise GatherError(f"the sources hold more than one run ({named})")
    if RUN not in found:
        raise GatherError(f"no run.json in {', '.join(map(str, sources))}: rank 0's machine "
                          f"writes it; gather its directory too")
    # several run.json of one run: rank 0's last write (with end_time) is the longest
    run_jsons = [RunDir(s).run for s in sources if RunDir(s).run.is_file()]
    found[RUN] = max(run_jsons, key=lambda p: p.stat().st_size)
    dest.mkdir(parents=True, exist_ok=True)
    copied = []
    for name, path in sorted(found.items()):
        target = dest / name
        if target.exists() and target.resolve() == path.resolve():
            continue
        tmp = dest / f".{name}.gather.tmp"
        shutil.copyfile(path, tmp)
        os.replace(tmp, target)
        copied.append(name)
    events = {json.dumps(e, sort_keys=True): e for s in sources for e in RunDir(s).read_events()}
    if events:
        merged = sorted(events.values(), key=lambda e: e.get("t", 0.0))
        write_text_atomic(RunDir(dest).events, "".join(json.dumps(e) + "\n" for e in merged))
        copied.append(EVENTS)
    return copied
