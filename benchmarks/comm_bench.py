"""All-reduce benchmark: hetsync's algorithms beside native gloo (see docs/comm-bench.md).

    .venv/bin/python benchmarks/comm_bench.py --world-sizes 2,4 --json comm-bench.json
"""

import sys

from hetsync.bench.comm import main

if __name__ == "__main__":
    sys.exit(main())
