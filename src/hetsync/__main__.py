import os
import sys

from hetsync.cli import main
from hetsync.comm.p2p import stranded

code = main()
if stranded():  # (see `stranded`: a shutdown under their threads would abort)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
raise SystemExit(code)
