"""`python -m hetsync` and the `hetsync` command alike (`run`)."""

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
    if stranded():  # (see `stranded`: a shutdown under their threads would abort)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise SystemExit(code)


if __name__ == "__main__":
    run()
