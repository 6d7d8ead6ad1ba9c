"""A run that is never closed: ``run = ss.init()`` without ``with`` and without
``run.close()``, as ``accelerator = Accelerator()`` is written. It trains a little, saves
in the background (a save thread, a gloo group of its own, staging buffers) and ends.

``python unclosed_run.py CKPT [--crash-rank R]``: with ``--crash-rank``, that rank raises
at the end instead (its peers must not wait for it at exit).
"""

from __future__ import annotations

import sys

import torch
from torch.utils.data import TensorDataset

import splitsync as ss

run = ss.init(seed=0, save_blocking=False)
model = run.model(torch.nn.Linear(4, 1))
opt = torch.optim.AdamW(model.parameters(), lr=0.1)
loader = run.loader(TensorDataset(torch.randn(64, 4)), batch_size=4, shuffle=True)
state = run.resume(sys.argv[1], model=model, optimizer=opt)
for _ in run.epochs(2, start=state.epoch):
    for (x,) in loader:
        run.backward(model(x).sum())
        run.step(opt)
    run.save()  # the last one is still in flight when the script ends
run.log(loss=1.0)
if "--crash-rank" in sys.argv and run.rank == int(sys.argv[sys.argv.index("--crash-rank") + 1]):
    raise RuntimeError("this rank crashes at the end")
run.print("done")
