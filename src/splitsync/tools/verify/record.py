"""In-script recorder for ``splitsync verify script.py``; inert unless the environment asks.

``init()`` calls :func:`from_environ` once and attaches the recorder to the run as an
observer. When ``SPLITSYNC_VERIFY_DIR`` is set the run:

- writes ``<dir>/rank<r>.json`` at once (so verify knows the script reached ``init``);
- gives each shuffled ``run.loader`` (the training data) a per-process batch of B/N, where B
  is ``SPLITSYNC_VERIFY_BATCH`` or agreed with the other run (:mod:`splitsync.tools.verify.agree`),
  and limits the dataset to ``steps x accumulate x B`` samples, so each epoch is ``steps``
  optimizer steps at any N;
- writes checkpoints, exports and ``run_dir`` under ``<dir>/files/`` instead of where the
  script asked (:meth:`ScriptRecorder.redirect_path`), so the two runs never see each other's
  files and the user's directories stay as they were;
- runs at most ``SPLITSYNC_VERIFY_EPOCHS`` epochs and stops the script (``SystemExit(0)``)
  after ``steps x epochs`` optimizer steps;
- records per optimizer step that steps (with ``accumulate=k``, every k-th ``run.step``,
  after the gradients were all-reduced): the loss, the gradient norm, the sample indices
  (``run.loader``) and hashes of the rows the model trained on; plus the initial-weight hash
  and each pass's ``set_epoch`` value and how many batches it trained on.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Subset

from splitsync.observe import Observer
from splitsync.tools.verify.agree import global_batch

__all__ = ["ScriptRecorder", "from_environ", "ENV_DIR"]

ENV_DIR = "SPLITSYNC_VERIFY_DIR"
ENV_BATCH = "SPLITSYNC_VERIFY_BATCH"
ENV_NPROC = "SPLITSYNC_VERIFY_NPROC"
ENV_STEPS = "SPLITSYNC_VERIFY_STEPS"
ENV_EPOCHS = "SPLITSYNC_VERIFY_EPOCHS"
ENV_SHARED = "SPLITSYNC_VERIFY_SHARED"  # folder both runs see (batch agreement)
ENV_TIMEOUT = "SPLITSYNC_VERIFY_TIMEOUT"


def _row_hashes(x: torch.Tensor) -> list[str]:
    rows = x.detach().to("cpu").contiguous()
    rows = rows.reshape(rows.shape[0], -1) if rows.dim() else rows.reshape(1, 1)
    return [hashlib.sha1(r.numpy().tobytes()).hexdigest()[:16] for r in rows]


class ScriptRecorder(Observer):
    """Collects one rank's trace of a verify run and writes it as JSON (a run observer)."""

    def __init__(self, out_dir: Path, rank: int, world: int, batch: int | None, nproc: int,
                 steps: int, epochs: int, *, accumulate: int = 1, shared: Path | None = None,
                 timeout: float = 300.0) -> None:
        self.path = out_dir / f"rank{rank}.json"
        self.files = out_dir / "files"  # this side's stand-in for the user's directories
        self.rank, self.world = rank, world
        self.batch, self.nproc = batch, nproc
        self.steps_per_epoch, self.max_epochs = steps, epochs
        self.accumulate = accumulate
        self.shared, self.timeout = shared, timeout
        self.data: dict[str, Any] = {"rank": rank, "world_size": world, "steps": [],
                                     "passes": [], "init_hash": None, "modules": [],
                                     "used_run_loader": False, "per_rank_batch": None}
        self._module: nn.Module | None = None
        self._pending: dict[str, Any] = {"losses": [], "rows": [], "indices": []}
        self._orders: dict[int, tuple[list[int], int, int]] = {}  # id -> order, batch, pass
        self._shuffled = 0
        self.steps_now: Callable[[], bool] = lambda: True  # run.sync_gradients, see bind()

    def bind(self, run: Any) -> None:
        """Read ``run.sync_gradients`` to tell a step that steps from a micro-step."""
        self.steps_now = lambda: bool(run.sync_gradients)

    # --- observer hooks ------------------------------------------------------------------
    def redirect_path(self, path: Path) -> Path:
        """The same path under this run's own ``files/`` folder (absolute, so the same on
        every rank and for relative and absolute names alike)."""
        absolute = Path(os.path.abspath(path))
        return self.files / absolute.relative_to(absolute.anchor)

    def loader_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Per-process batch B/N and a dataset of steps x accumulate x B samples (shuffled
        loaders only: an unshuffled loader is taken for evaluation and left whole)."""
        if not kwargs.get("shuffle"):
            return kwargs
        own = int(kwargs["batch_size"])
        index, self._shuffled = self._shuffled, self._shuffled + 1
        if self.batch is not None:
            global_b = self.batch
        elif self.shared is not None:
            global_b = global_batch(self.shared, index, own, self.rank, self.world,
                                    self.nproc, self.timeout)
        else:
            global_b = own * self.nproc
        if global_b % self.world:
            raise ValueError(f"splitsync verify: global batch {global_b} is not divisible "
                             f"by {self.world} processes; pass --batch a multiple of it.")
        per_rank = global_b // self.world
        dataset = kwargs["dataset"]
        keep = min(len(dataset), self.steps_per_epoch * self.accumulate * global_b)
        self.data["used_run_loader"] = True
        self.data["per_rank_batch"] = per_rank
        return {**kwargs, "batch_size": per_rank, "dataset": Subset(dataset, range(keep))}

    def on_model(self, module: nn.Module) -> None:
        from splitsync.tools.guards.consistency import param_fingerprints

        self._module = module
        _, fp = param_fingerprints(module)
        self.data["init_hash"] = hashlib.sha1(str(fp.tolist()).encode()).hexdigest()[:16]
        self.data["modules"] = sorted({_module_name(m) for m in module.modules()})
        module.register_forward_pre_hook(self._on_forward)

    def _on_forward(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        # only forwards that train: a peek at a batch under no_grad or in eval is not a step
        if module.training and torch.is_grad_enabled() and args \
                and isinstance(args[0], torch.Tensor):
            self._pending["rows"].extend(_row_hashes(args[0]))

    def on_loader_iter(self, loader: Any) -> None:
        sampler = loader.sampler
        order = list(iter(sampler)) if sampler is not None else []
        self._orders[id(loader)] = (order, loader.batch_size or 1, len(self.data["passes"]))
        self.data["passes"].append({"loader": id(loader) % 100003,
                                    "shuffle": bool(getattr(sampler, "shuffle", False)),
                                    "epoch": getattr(sampler, "epoch", None), "trained": 0})

    def epochs(self, start: int, n: int) -> int:
        return min(n, start + self.max_epochs)

    def on_backward(self, loss: torch.Tensor, active: Any) -> None:
        self._pending["losses"].append(float(loss.detach().float().item()))
        if active is not None and id(active) in self._orders:
            order, bs, index = self._orders[id(active)]
            seen = active.batches_seen
            self._pending["indices"].extend(order[(seen - 1) * bs: seen * bs])
            self.data["passes"][index]["trained"] += 1  # a pass only peeked at stays 0

    def on_step_begin(self, optimizer: Any = None) -> None:
        """Before a step that steps: the gradients are final (all-reduced) here. A
        micro-step (accumulate=k) only keeps its loss and samples for the coming step."""
        if not self.steps_now():
            return
        grads = [p.grad.detach().float().norm() for p in self._params() if p.grad is not None]
        norm = float(torch.stack(grads).norm().item()) if grads else 0.0
        losses = self._pending["losses"]
        self.data["steps"].append({"loss": sum(losses) / len(losses) if losses else None,
                                   "grad_norm": norm, "rows": self._pending["rows"],
                                   "indices": self._pending["indices"],
                                   "pass": len(self.data["passes"])})
        self._pending = {"losses": [], "rows": [], "indices": []}
        self.flush()

    def on_step_end(self, optimizer: Any = None, norm: Any = None) -> None:
        if len(self.data["steps"]) >= self.steps_per_epoch * self.max_epochs:
            raise SystemExit(0)  # enough steps recorded: end the script quietly

    def on_close(self, clean: bool) -> None:
        self.flush()

    def flush(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data))
        os.replace(tmp, self.path)

    def _params(self) -> list[nn.Parameter]:
        return list(self._module.parameters()) if self._module is not None else []


def _module_name(m: nn.Module) -> str:
    """Type name; a dropout that drops nothing (p=0) is not reported as dropout."""
    name = type(m).__name__
    return f"{name}(p=0)" if name.startswith("Dropout") and not getattr(m, "p", 0) else name


def from_environ(environ: Mapping[str, str], rank: int, world: int,
                 accumulate: int = 1) -> ScriptRecorder | None:
    """The recorder when ``splitsync verify`` launched this script, else None."""
    out = environ.get(ENV_DIR)
    if not out:
        return None
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    batch = environ.get(ENV_BATCH)
    shared = environ.get(ENV_SHARED)
    recorder = ScriptRecorder(path, rank, world, int(batch) if batch else None,
                              int(environ.get(ENV_NPROC, "1")), int(environ.get(ENV_STEPS, "3")),
                              int(environ.get(ENV_EPOCHS, "2")), accumulate=accumulate,
                              shared=Path(shared) if shared else None,
                              timeout=float(environ.get(ENV_TIMEOUT, "300")))
    recorder.flush()  # the script reached init(): verify tells this from "never called it"
    return recorder
