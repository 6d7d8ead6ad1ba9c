"""What splitsync reads from the launcher, without starting a group.

usage: probe_env.py OUT TAG  -- writes OUT/TAG-<pid>.json
"""

import json
import os
import sys

from splitsync.distributed.env import batch_note, detect_env

env = detect_env()
report = {"launcher": env.launcher, "rank": env.rank, "world_size": env.world_size,
          "local_rank": env.local_rank, "local_world_size": env.local_world_size,
          "node_rank": env.node_rank, "job_id": env.job_id,
          "note": batch_note(os.environ, env),
          "slurm": {k: v for k, v in os.environ.items() if k.startswith("SLURM_")}}
with open(os.path.join(sys.argv[1], f"{sys.argv[2]}-{os.getpid()}.json"), "w") as fh:
    json.dump(report, fh)
