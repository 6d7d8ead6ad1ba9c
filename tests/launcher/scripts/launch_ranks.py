"""Each rank writes OUT/rank_<RANK> with the arguments it received (JSON); nothing else.

usage: launch_ranks.py OUT [ARGS...]; LAUNCH_TEST_FAIL_RANK=K makes rank K exit with code 3.
"""

import json
import os
import sys

out, rank = sys.argv[1], os.environ.get("RANK", "none")
with open(os.path.join(out, f"rank_{rank}"), "w") as fh:
    json.dump({"args": sys.argv[2:], "world_size": os.environ.get("WORLD_SIZE"),
               "omp": os.environ.get("OMP_NUM_THREADS"),
               "master_addr": os.environ.get("MASTER_ADDR")}, fh)
if os.environ.get("LAUNCH_TEST_FAIL_RANK") == rank:
    print(f"rank {rank} fails on purpose", file=sys.stderr)
    sys.exit(3)
