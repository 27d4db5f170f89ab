"""The forked processes' server ends without Python's teardown (imported there only: the last
of `forked.PRELOAD`).

The server lives until its caller (`launch`) exits and then ends as any Python process does,
tearing down the torch it imported: about a second of CPU on this project's 2-core machine,
all the while holding the caller's stdout and stderr -- so whoever reads them (a pipe, a
test's `subprocess.run`) waited that second longer for every `launch`. The server has nothing
to flush or close, so once its loop has ended it leaves with `os._exit`. Only the process
that imported this does: the children it forks inherit the hook, but they end with
`os._exit` themselves (multiprocessing's `Process._bootstrap`), and the pid would not match.
"""

from __future__ import annotations

import atexit
import os

_SERVER = os.getpid()


def _exit_now() -> None:
    if os.getpid() == _SERVER:
        os._exit(0)


atexit.register(_exit_now)  # (the last registered runs first: what the server registered
# before, multiprocessing's own, is for children of a Process, which it has none of)
