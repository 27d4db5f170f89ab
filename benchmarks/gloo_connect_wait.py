"""How long making a gloo group waits for a member that died while the group was being made.

Three processes share a TCPStore; each makes a group of all three with
`dist.new_group(..., timeout=T, use_local_synchronization=True)` (as `Membership.groups`
does). Rank 2 comes 1 s late, and rank 0 is killed `--kill-after` seconds into its own
making, once it may have published its address. Printed: each survivor's seconds until
`new_group` gave up, and gloo's words for why, for each group timeout T.

    .venv/bin/python benchmarks/gloo_connect_wait.py --timeouts 2,5 --kill-after 0.2,0.4

Where a survivor waits for the dead rank's connection (gloo's "Connect timeout"), it waits
five times T (its connection retries); where it connects to the dead rank's address itself,
it is refused within about a second.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import signal
import subprocess
import sys
import threading
import time


def member(rank: int, port: int, timeout: float, kill_after: float) -> None:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, is_master=False,
                          timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=3,
                            timeout=datetime.timedelta(seconds=60))
    store.set(f"ready/{rank}", "1")
    store.wait([f"ready/{r}" for r in range(3)])
    if rank == 0:
        threading.Timer(kill_after, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    if rank == 2:
        time.sleep(1.0)
    start = time.monotonic()
    try:
        dist.new_group([0, 1, 2], timeout=datetime.timedelta(seconds=timeout),
                       use_local_synchronization=True, sort_ranks=False)
        why = "made"
    except Exception as err:  # noqa: BLE001 - what is measured
        text = str(err)
        why = ("connect timeout" if "Connect timeout" in text else
               "refused" if "refused" in text.lower() or "endpoint" in text.lower() else
               "store wait" if "wait timeout" in text else text[:60])
    print(f"{rank} {time.monotonic() - start:.1f} {why}", flush=True)


def trial(timeout: float, kill_after: float) -> list[str]:
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=120))
    procs = [subprocess.Popen([sys.executable, __file__, "--member", str(r), str(server.port),
                               str(timeout), str(kill_after)],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for r in range(3)]
    lines = []
    for proc in procs:
        out, _ = proc.communicate(timeout=20 * timeout + 60)
        lines += out.split("\n")
    return sorted(line for line in lines if line.strip())


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--member":
        rank, port, timeout, kill_after = sys.argv[2:6]
        member(int(rank), int(port), float(timeout), float(kill_after))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeouts", default="2,5", help="group timeouts T, seconds")
    parser.add_argument("--kill-after", default="0.2,0.4",
                        help="seconds into its making at which rank 0 is killed")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    import torch

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(f"# commit {commit}, torch {torch.__version__}, {platform.node()}, "
          f"{os.cpu_count()} cores, wall clock")
    print("| T (s) | rank 0 killed after (s) | trial | rank 1 | rank 2 |")
    print("|---|---|---|---|---|")
    for timeout in map(float, args.timeouts.split(",")):
        for kill_after in map(float, args.kill_after.split(",")):
            for repeat in range(args.repeats):
                survivors = {line.split()[0]: " ".join(line.split()[1:])
                             for line in trial(timeout, kill_after)}
                print(f"| {timeout:g} | {kill_after:g} | {repeat + 1} | "
                      f"{survivors.get('1', '-')} | {survivors.get('2', '-')} |", flush=True)


if __name__ == "__main__":
    main()
