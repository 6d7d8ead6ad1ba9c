"""DataLoader workers made by ``run.loader`` outlive a preemption signal sent to their
process group (torchrun's agent, ``scancel``, ``kill -TERM -PGID``), and still end when
their parent shuts them down, at exit included (persistent workers)."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from splitsync.distributed.seeding import worker_init_fn
from splitsync.preemption.workers import ShieldedInit, shielded
from splitsync.testing import clean_env

# A process that iterates a slow loader with 2 workers, prints "ready" after its first
# batch, notes SIGTERM itself (as the run's preemption does) and prints how many batches it
# got; persistent workers stay alive until the interpreter exits.
_SCRIPT = textwrap.dedent("""
    import signal, sys, time
    import torch
    from torch.utils.data import DataLoader, Dataset
    from splitsync.preemption.workers import shielded
    from splitsync.distributed.seeding import worker_init_fn

    class Slow(Dataset):
        def __len__(self):
            return 12
        def __getitem__(self, i):
            time.sleep(0.05)
            return torch.tensor([i])

    got = []
    signal.signal(signal.SIGTERM, lambda s, f: got.append(s))
    shield = (signal.SIGTERM,) if sys.argv[1] == "shielded" else ()
    loader = DataLoader(Slow(), batch_size=2, num_workers=2, persistent_workers=True,
                        worker_init_fn=shielded(worker_init_fn, shield))
    for epoch in range(2):
        for n, batch in enumerate(loader):
            if epoch == 0 and n == 0:
                print("ready", flush=True)
                time.sleep(1.0)  # the group's SIGTERM arrives here
    print("batches", 2 * len(loader), "signals", len(got), flush=True)
""")


def _run(mode: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen([sys.executable, "-c", _SCRIPT, mode], env=clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.strip() == "ready", first
        time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGTERM)  # the process and both workers
        out, _ = proc.communicate(timeout=90)  # persistent workers must not hang the exit
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("the process did not exit: its workers outlived their parent's shutdown")
    return subprocess.CompletedProcess(proc.args, proc.returncode, first + out, "")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_shielded_workers_outlive_a_sigterm_to_the_group_and_end_at_exit() -> None:
    done = _run("shielded")
    assert done.returncode == 0, done.stdout
    assert "batches 12 signals 1" in done.stdout, done.stdout


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_unshielded_workers_die_of_the_group_sigterm() -> None:
    # torch's own handler: a SIGTERM its parent did not send kills the worker, and the
    # parent's next batch raises (what a stop with workers used to end in)
    died = _run("plain")
    assert died.returncode != 0, died.stdout
    assert "is killed by signal" in died.stdout, died.stdout


def test_shielded_wraps_once_keeps_the_init_and_pickles() -> None:
    assert shielded(worker_init_fn, ()) is worker_init_fn  # preemption off: torch's rule
    wrapped = shielded(worker_init_fn, (signal.SIGTERM, signal.SIGUSR1))
    assert wrapped == ShieldedInit(worker_init_fn, (int(signal.SIGTERM), int(signal.SIGUSR1)))
    again = shielded(wrapped, (signal.SIGTERM,))
    assert again == ShieldedInit(worker_init_fn, (int(signal.SIGTERM),))
    assert pickle.loads(pickle.dumps(wrapped)) == wrapped  # spawned workers get it too
