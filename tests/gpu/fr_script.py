"""Under ``splitsync run`` with NCCL: the flight recorder is on; dump its records by hand.

python -m splitsync run -n 1 fr_script.py OUT_FILE RUN_DIR
"""

from __future__ import annotations

import json
import os
import pickle
import sys

import torch

import splitsync

with splitsync.init(seed=0, backend="nccl", device="cuda", run_dir=sys.argv[2]) as run:
    import torch.distributed as dist

    dist.all_reduce(torch.ones(4, device=run.device))
    torch.cuda.synchronize()
    raw = torch._C._distributed_c10d._dump_nccl_trace()  # what a timeout's dump writes
    target = os.environ["TORCH_FR_DUMP_TEMP_FILE"] + str(run.rank)
    with open(target, "wb") as f:
        f.write(raw)
    entries = pickle.loads(raw).get("entries", [])
    with open(sys.argv[1], "w") as f:
        json.dump({"env": {k: os.environ.get(k) for k in (
            "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_FR_DUMP_TEMP_FILE")},
            "ops": [e.get("profiling_name", "") for e in entries], "dump": target}, f)
