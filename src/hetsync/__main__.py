"""`python -m hetsync` and the `hetsync` command alike (`run`)."""

import logging
import os
import sys


def run() -> None:
    if sys.argv[1:2] in (["launch"], ["bench"]):
        # the run's processes' warm parent starts before this process imports torch, so
        # that the two import side by side (`runtime/forked.py`)
        from hetsync.runtime import forked

        forked.warm_up()
    from hetsync.cli import main
    from hetsync.comm.p2p import stranded

    code = main()
    # Leave without the interpreter's teardown where it would abort under a thread left in a
    # transfer (see `stranded`), or where it is only time: a launch's torch takes about 0.5 s
    # to tear down here, after the run's files are written and closed and its processes
    # stopped (what the run is waited for by, the user or a test, waits that long more).
    if stranded() or sys.argv[1:2] == ["launch"]:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise SystemExit(code)


if __name__ == "__main__":
    run()
