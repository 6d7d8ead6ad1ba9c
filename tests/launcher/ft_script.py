"""A fault-tolerant training script for the launcher tests and benchmarks/ft_*.py.

One replica group's process: an MLP trained with AdamW on a synthetic indexable dataset
under ``init(fault_tolerance="torchft", ledger=True)``. Every rank writes one JSON line per
step to ``OUT/steps-g<group>-r<rank>.jsonl`` (pid, committed, step, participants, weights
hash). Options:

  --kill-at S,S,...  group 1's rank 0 SIGKILLs itself after committed step S (the i-th
                     incarnation of group 1 dies at the i-th step of the list); with
                     --kill-mid in the step after it, once its quorum formed (the peers'
                     all-reduce then fails and they discard the step)
  --kill-every K --kills N
                     with --kill-mid: group 1 dies after K committed steps of each of its
                     first N incarnations
  --slow SECONDS     while group 1 is down (between its kill and its first commit after
                     coming back) the other groups sleep this long per step, so that they
                     are still training when it returns
  --wait-full S      with a planned kill, each step sleeps S until every group has joined
                     a quorum once (default 0.05): a kill needs them all
  --sleep SECONDS    simulated compute per step
  --strategy ddp|hsdp, --samples N, --epochs E, --save-every K
  --plain            the same training without fault tolerance (DDP; a failure restarts all)
  --stop-at S        every group ends after committed step S (the job stops; relaunched, it
                     resumes from its last checkpoint)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import time
from pathlib import Path

import torch
from torch import nn

import splitsync as ss


class Synthetic(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(16, generator=torch.Generator().manual_seed(i))
        return x, torch.tensor(int(x.sum() > 0))


def weights_hash(model: nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        t = p.detach()
        t = t.full_tensor() if hasattr(t, "full_tensor") else t
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


class _Plain:
    """What the log needs of a step without fault tolerance."""

    committed, participants = True, 1

    def __init__(self, step: int) -> None:
        self.step = step

    def __bool__(self) -> bool:
        return True


def main(a: argparse.Namespace) -> None:
    out = Path(a.out)
    down = out / "group1-down"
    kills = [int(s) for s in a.kill_at.split(",") if s]
    ft = {} if a.plain else {"fault_tolerance": "torchft"}
    with ss.init(seed=0, strategy=a.strategy, ledger=True, run_dir=str(out), **ft) as run:
        torch.manual_seed(0)
        model = run.model(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        loader = run.loader(Synthetic(a.samples), batch_size=a.batch_size, shuffle=True)
        state = run.resume(out / "ckpt", model=model, optimizer=opt)
        g, me = (0 if a.plain else run.replica_group), os.getpid()
        log = open(out / f"steps-g{g}-r{run.rank}.jsonl", "a", buffering=1)  # noqa: SIM115
        refused = False
        if not a.plain:  # count= and preemption are left out under fault tolerance
            try:
                run.backward(torch.zeros((), requires_grad=True), count=1)
            except NotImplementedError:
                refused = True
        log.write(json.dumps({"ev": "start", "pid": me, "step": state.step,
                              "restart": run.env.restart_count, "t": time.time(),
                              "count_refused": refused,
                              "preempt_armed": run._preemption is not None}) + "\n")
        incarnation = run.env.restart_count
        taken = state.step  # steps of the run so far (plain)
        mine = 0  # steps this incarnation committed
        # a planned kill needs a quorum with every group: a group that starts seconds before
        # the others (a loaded machine) trains slowly until they join, not to its end alone
        seen_full = not (kills or a.kill_every)
        for _epoch in run.epochs(a.epochs, start=state.epoch):
            for x, y in run.progress(loader, every=200):  # group-batches that counted
                full = not a.plain and run.session.participants == run.replica_groups
                seen_full = seen_full or full or a.plain
                due = (incarnation < len(kills) and run.session.step >= kills[incarnation]) or (
                    a.kill_every and incarnation < a.kills and mine >= a.kill_every)
                if g == 1 and a.kill_mid and run.rank == 0 and due and full:
                    down.touch()  # mid-step: the quorum with every group has formed
                    os.kill(os.getpid(), signal.SIGKILL)
                loss = nn.functional.cross_entropy(model(x), y)
                run.backward(loss)
                time.sleep(a.sleep)
                res = run.step(opt)
                mine += int(bool(res))
                if not seen_full:
                    time.sleep(a.wait_full)
                if a.plain:  # without fault tolerance every step counts
                    taken += 1
                    res = _Plain(taken)
                if res and res.step % 50 == 0:
                    run.log(loss=loss)  # numbered by committed steps
                log.write(json.dumps({"ev": "step", "pid": me, "committed": res.committed,
                                      "step": res.step, "P": res.participants,
                                      "hash": weights_hash(model), "t": time.time()}) + "\n")
                if g == 1 and res and incarnation > 0 and down.exists() and run.rank == 0:
                    down.unlink()  # back: the others may go at full speed again
                if g != 1 and down.exists():
                    time.sleep(a.slow)
                if (g == 1 and res and not a.kill_mid and incarnation < len(kills)
                        and res.step >= kills[incarnation] and run.rank == 0
                        and not a.plain and res.participants == run.replica_groups):
                    down.touch()
                    os.kill(os.getpid(), signal.SIGKILL)
                if res and a.save_every and res.step % a.save_every == 0:
                    run.save()
                if res and a.stop_at and res.step >= a.stop_at:
                    log.write(json.dumps({"ev": "stopped", "pid": me, "step": res.step,
                                          "t": time.time()}) + "\n")
                    return  # every group stops here, without a save of its own
        log.write(json.dumps({"ev": "done", "pid": me, "step": taken if a.plain else
                              run.session.step,
                              "hash": weights_hash(model), "t": time.time()}) + "\n")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--kill-at", default="")
    p.add_argument("--kill-mid", action="store_true",
                   help="die after the step's quorum formed, before backward (else after a commit)")
    p.add_argument("--kill-every", type=int, default=0,
                   help="with --kill-mid: group 1 dies after this many committed steps of its own")
    p.add_argument("--kills", type=int, default=0, help="how often --kill-every applies")
    p.add_argument("--slow", type=float, default=0.25)
    p.add_argument("--wait-full", type=float, default=0.05,
                   help="with a planned kill: seconds a step sleeps until every group has joined")
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--strategy", default="ddp")
    p.add_argument("--samples", type=int, default=1003)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--save-every", type=int, default=0)
    p.add_argument("--plain", action="store_true", help="no fault tolerance (DDP, restarts)")
    p.add_argument("--stop-at", type=int, default=0, help="end the job after this step")
    main(p.parse_args())
