"""A run with the sample ledger on, trained from two loaders at once: an indexable dataset and
a 12-shard stream read by 2 workers per rank; each step takes one batch of each.

Both hold 48 samples, batch 2 per rank, so an epoch has the same number of steps from each at
any world size. Saves every 3 steps and at each epoch's end. The script writes its own record
of the sample ids it trained (``ids/<launch>-r<rank>.txt``), from the samples themselves, for
the test to count without the ledger. Options (steps are the run's optimizer steps):

  --kill K        first attempt: rank 1 SIGKILLs itself after step K
  --kill-save K   second attempt: rank 0 SIGKILLs itself inside run.save at step K
  --stop K        end cleanly after step K (no save of its own)
  --seed S / --n N / --drop-position / --map-only   the faults the audit must catch
"""

from __future__ import annotations

import argparse
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset

import splitsync as ss

EPOCHS = 3


class Indexed(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.randn(4, generator=torch.Generator().manual_seed(i)), i


class Stream(IterableDataset):
    """12 shards of 4 samples; a sample carries its own id."""

    n_shards = 12

    def shard(self, num_shards: int, index: int):  # type: ignore[no-untyped-def]
        for i in range(index * 4, index * 4 + 4):
            yield torch.randn(4, generator=torch.Generator().manual_seed(1000 + i)), i

    def __iter__(self):  # type: ignore[no-untyped-def]
        for s in range(self.n_shards):
            yield from self.shard(self.n_shards, s)


class KillInSave:
    """Registered with run.resume: its state_dict runs inside run.save (on rank 0)."""

    def __init__(self, run: Any, at: int | None) -> None:
        self.run, self.at, self.step = run, at, 0

    def state_dict(self) -> dict[str, int]:
        if self.step == self.at and self.run.env.restart_count == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return {}

    def load_state_dict(self, state: dict[str, int]) -> None:
        pass


def main(a: argparse.Namespace) -> None:
    with ss.init(seed=a.seed, ledger=True, run_dir=a.run_dir) as run:
        model = run.model(nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        plain = DataLoader(Indexed(a.n), batch_size=2, shuffle=True)  # a plain DataLoader
        loaders = [run.loader(plain)]
        if not a.map_only:
            loaders.append(run.loader(Stream(), batch_size=2, shuffle=True, buffer_size=3,
                                      num_workers=2))
        probe = KillInSave(run, a.kill_save)
        state = run.resume(Path(a.run_dir) / "ckpt", model=model, optimizer=opt, probe=probe)
        if a.drop_position:  # the fault: model and optimizer restored, data position not
            loaders[0].sampler.resume_at(state.epoch, 0)
        me = run.broadcast(uuid.uuid4().hex)
        ids = Path(a.run_dir) / "ids"
        ids.mkdir(exist_ok=True)
        out = open(ids / f"{me}-r{run.rank}.txt", "a", buffering=1)  # noqa: SIM115
        out.write(f"R {state.step} {run.world_size} {time.time()}\n")
        step = state.step
        for epoch in run.epochs(EPOCHS, start=state.epoch):
            its = [iter(ld) for ld in loaders]
            for batches in zip(*its, strict=False):
                loss = sum(F.mse_loss(model(x).squeeze(1), i.float() / 48) for x, i in batches)
                run.backward(loss)
                run.step(opt)
                step += 1
                for k, (ld, (_, i)) in enumerate(zip(loaders, batches, strict=True)):
                    trained = ld.trim_padding(i)  # padding repeats are not new samples
                    out.write(f"S {step} {k} {epoch} {' '.join(map(str, trained.tolist()))}\n")
                if step == a.kill and run.rank == 1 and run.env.restart_count == 0:
                    os.kill(os.getpid(), signal.SIGKILL)
                if step == a.stop:
                    return
                probe.step = step
                if step % 3 == 0:
                    run.save()
            for it in its:  # run every pass to its end (a stream learns it finished)
                for _ in it:
                    raise AssertionError("the loaders' epochs differ in length")
            if step % 3:
                probe.step = step
                run.save()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("run_dir")
    p.add_argument("--kill", type=int)
    p.add_argument("--kill-save", type=int)
    p.add_argument("--stop", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n", type=int, default=48)
    p.add_argument("--drop-position", action="store_true")
    p.add_argument("--map-only", action="store_true")
    main(p.parse_args())
