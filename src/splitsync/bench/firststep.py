"""Worker for the launch benchmark: form the group, take one training step, stamp the time.

Run under a launcher (torchrun or ``splitsync run``); rank 0 writes ``time.time()`` after
the first optimizer step to the ``--stamp`` file. ``--mode hand`` is plain PyTorch,
``--mode splitsync`` the same step through splitsync.
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stamp", required=True)
    parser.add_argument("--mode", choices=("hand", "splitsync"), required=True)
    args = parser.parse_args()

    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    x, y = torch.randn(32, 32), torch.randint(0, 10, (32,))
    if args.mode == "hand":
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        dist.init_process_group("gloo")
        rank = dist.get_rank()
        model = DDP(net)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        t = time.time()
        dist.destroy_process_group()
    else:
        import splitsync

        with splitsync.init(seed=0) as run:
            rank = run.rank
            model = run.model(net)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            run.backward(F.cross_entropy(model(x), y))
            run.step(opt)
            t = time.time()
    if rank == 0:
        tmp = args.stamp + f".{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(repr(t))
        os.replace(tmp, args.stamp)


if __name__ == "__main__":
    main()
