"""In-script recorder for ``splitsync verify script.py``; inert unless the environment asks.

``init()`` reads :func:`settings` (a strategy or accumulation verify imposes) and
:func:`from_environ` once, and attaches the recorder to the run as an observer. When
``SPLITSYNC_VERIFY_DIR`` is set the run:

- writes ``<dir>/rank<r>.json`` at once (so verify knows the script reached ``init``);
- trains each shuffled ``run.loader`` (the training data) at the global batch agreed with
  the reference launch (:mod:`splitsync.tools.verify.agree`), and limits its dataset to
  ``steps`` optimizer steps of it, so every launch's epoch is the same samples;
- writes checkpoints, exports and ``run_dir`` under ``<dir>/files/`` instead of where the
  script asked (:meth:`ScriptRecorder.redirect_path`);
- runs at most ``SPLITSYNC_VERIFY_EPOCHS`` epochs and stops the script (``SystemExit(0)``)
  once ``SPLITSYNC_VERIFY_STOP`` optimizer steps are done (counted from a resumed
  checkpoint's step), after writing the final parameters (``params.pt``, rank 0);
- records per optimizer step that really steps (``on_step_end``'s ``stepped``): the loss
  (what the gradient is the gradient of: under ``run.backward(loss, count=n)`` the mean
  over the step's items, with their count), the micro-steps, the gradient norm, the learning
  rates the step used, the sample indices (``run.loader``), hashes of the rows the model
  trained on and the optimizer's own step count; plus the initial-weight hash, each pass's ``set_epoch`` value, checkpoints
  saved and the step a checkpoint resumed at.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Subset

from splitsync.observe import Observer
from splitsync.tools.verify import agree
from splitsync.tools.verify.draws import Draws

__all__ = ["ScriptRecorder", "from_environ", "settings", "ENV_DIR"]

ENV_DIR = "SPLITSYNC_VERIFY_DIR"
ENV_BATCH = "SPLITSYNC_VERIFY_BATCH"  # --batch: the reference's global batch per micro-step
ENV_NPROC = "SPLITSYNC_VERIFY_NPROC"
ENV_STEPS = "SPLITSYNC_VERIFY_STEPS"
ENV_EPOCHS = "SPLITSYNC_VERIFY_EPOCHS"
ENV_SHARED = "SPLITSYNC_VERIFY_SHARED"  # folder every launch sees (batch agreement)
ENV_TIMEOUT = "SPLITSYNC_VERIFY_TIMEOUT"
ENV_ROLE = "SPLITSYNC_VERIFY_ROLE"  # "ref": publishes the global batch; else reads it
ENV_STRATEGY = "SPLITSYNC_VERIFY_STRATEGY"  # init(strategy=...) imposed by --strategies
ENV_ACCUMULATE = "SPLITSYNC_VERIFY_ACCUMULATE"  # factor on init(accumulate=...)
ENV_STOP = "SPLITSYNC_VERIFY_STOP"  # optimizer steps after which the script is stopped


def settings(environ: Mapping[str, str], strategy: str, accumulate: int) -> tuple[str, int]:
    """``init()``'s strategy and accumulation, as a verify launch imposes them."""
    if not environ.get(ENV_DIR):
        return strategy, accumulate
    factor = int(environ.get(ENV_ACCUMULATE, "1"))
    return environ.get(ENV_STRATEGY) or strategy, accumulate * factor


def mesh_setting(environ: Mapping[str, str], mesh: Mapping[str, int] | None,
                 world_size: int) -> Mapping[str, int] | None:
    """``init(mesh=...)`` as a verify launch imposes it: the one-process reference of a
    script written for a mesh runs every dimension at 1 (the same model, whole), so its
    training is what the tensor-parallel launch must match."""
    if not environ.get(ENV_DIR) or mesh is None or world_size != 1:
        return mesh
    return {}


def _row_hashes(x: torch.Tensor) -> list[str]:
    rows = x.detach().to("cpu").contiguous()
    rows = rows.reshape(rows.shape[0], -1) if rows.dim() else rows.reshape(1, 1)
    return [hashlib.sha1(r.numpy().tobytes()).hexdigest()[:16] for r in rows]


def _local(t: torch.Tensor) -> torch.Tensor:
    """A full tensor from a sharded one (FSDP2's DTensor: collective, every rank calls)."""
    full = getattr(t, "full_tensor", None)
    return full() if callable(full) else t


def _optimizer_steps(optimizer: Any) -> float:
    """The optimizer's own count of steps (Adam's ``step``), or how many tensors have
    state (SGD with momentum): 0 for an optimizer that starts afresh."""
    for state in optimizer.state.values():
        if "step" in state:
            return float(_local(torch.as_tensor(state["step"])))
    return float(len(optimizer.state))


class ScriptRecorder(Observer):
    """Collects one rank's trace of a verify run and writes it as JSON (a run observer)."""

    def __init__(self, out_dir: Path, rank: int, world: int, batch: int | None,
                 steps: int, epochs: int, *, accumulate: int = 1, shared: Path | None = None,
                 reference: bool = True, stop: int | None = None,
                 timeout: float = 300.0) -> None:
        self.path = out_dir / f"rank{rank}.json"
        self.params_path = out_dir / "params.pt"
        self.files = out_dir / "files"  # this side's stand-in for the user's directories
        self.rank, self.world = rank, world
        self.batch, self.accumulate = batch, accumulate
        self.steps_per_epoch, self.max_epochs = steps, epochs
        self.stop = steps * epochs if stop is None else stop
        self.shared, self.reference, self.timeout = shared, reference, timeout
        self.data: dict[str, Any] = {"rank": rank, "world_size": world, "steps": [],
                                     "passes": [], "init_hash": None, "modules": [],
                                     "used_run_loader": False, "per_rank_batch": None,
                                     "accumulate": accumulate, "wrapper": None,
                                     "resumed_step": None, "saves": [], "first_step": 0,
                                     "params": False, "tp_size": 1, "tp_rank": 0,
                                     "mesh": False}
        self._module: nn.Module | None = None
        self._pending: dict[str, Any] = {"losses": [], "counts": [], "rows": [], "indices": []}
        self._grad_norm = 0.0
        self._opt_steps = 0.0
        self._lr: list[float] = []
        self._orders: dict[int, tuple[list[int], int, int]] = {}  # id -> order, batch, pass
        self._shuffled = 0
        self._draws: Draws | None = None  # global-RNG draws per step, from run.model on

    # --- observer hooks ------------------------------------------------------------------
    def redirect_path(self, path: Path) -> Path:
        """The same path under this run's own ``files/`` folder (absolute, so the same on
        every rank and for relative and absolute names alike)."""
        absolute = Path(os.path.abspath(path))
        return self.files / absolute.relative_to(absolute.anchor)

    def loader_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Per-process micro-batch for the agreed global batch, and a dataset of ``steps``
        optimizer steps (shuffled loaders only: an unshuffled loader is taken for
        evaluation and left whole)."""
        if not kwargs.get("shuffle"):
            return kwargs
        own = int(kwargs["batch_size"])
        index, self._shuffled = self._shuffled, self._shuffled + 1
        if self.reference or self.shared is None:
            per_rank = own if self.batch is None else agree.per_rank(self.batch, 1, self.world)
            global_b = per_rank * self.accumulate * self.world
            if self.shared is not None and self.rank == 0:
                agree.publish(self.shared, index, global_b)
        else:
            global_b = agree.read_global(self.shared, index, self.timeout)
            per_rank = agree.per_rank(global_b, self.accumulate, self.world)
        dataset = kwargs["dataset"]
        keep = min(len(dataset), self.steps_per_epoch * global_b)
        self.data["used_run_loader"] = True
        self.data["per_rank_batch"] = per_rank
        return {**kwargs, "batch_size": per_rank, "dataset": Subset(dataset, range(keep))}

    def on_model(self, module: nn.Module) -> None:
        from splitsync.observers.guards.consistency import param_fingerprints

        self._module = module
        _, fp = param_fingerprints(module)
        self.data["init_hash"] = hashlib.sha1(str(fp.tolist()).encode()).hexdigest()[:16]
        self.data["modules"] = sorted({_module_name(m) for m in module.modules()})
        module.register_forward_pre_hook(self._on_forward)

    def on_wrapped(self, model: nn.Module) -> nn.Module:
        self.data["wrapper"] = type(model).__name__
        self._draws = Draws()  # what the model's construction drew is not a step's
        return model

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
                                    "custom": getattr(sampler, "user_sampler", None) is not None,
                                    "epoch": getattr(sampler, "epoch", None), "trained": 0})

    def epochs(self, start: int, n: int) -> int:
        return min(n, start + self.max_epochs)

    def on_backward(self, loss: torch.Tensor, active: Any, count: float | None = None) -> None:
        self._pending["losses"].append(float(loss.detach().float().item()))
        self._pending["counts"].append(count)
        if active is not None and id(active) in self._orders:
            order, bs, index = self._orders[id(active)]
            seen = active.batches_seen
            self._pending["indices"].extend(order[(seen - 1) * bs: seen * bs])
            self.data["passes"][index]["trained"] += 1  # a pass only peeked at stays 0

    def on_step_begin(self, optimizer: Any = None) -> None:
        """Before ``run.step``: the gradient norm (final, all-reduced, when it steps; a
        micro-step's is overwritten by the next), the optimizer's own step count and the
        learning rates this step uses (a scheduler steps after it)."""
        grads = [_local(p.grad.detach()).float().norm() for p in self._params()
                 if p.grad is not None]
        self._grad_norm = float(torch.stack(grads).norm().item()) if grads else 0.0
        self._opt_steps = _optimizer_steps(optimizer) if optimizer is not None else 0.0
        self._lr = [float(g["lr"]) for g in optimizer.param_groups] if optimizer is not None \
            else []

    def on_step_end(self, optimizer: Any = None, norm: Any = None,
                    stepped: bool = True) -> None:
        """A step that stepped becomes a record; a micro-step keeps its loss and samples
        for the coming step."""
        if not stepped:
            return
        losses, counts = self._pending["losses"], self._pending["counts"]
        loss, count = _step_loss(losses, counts, self.accumulate)
        self.data["steps"].append({
            "loss": loss, "count": count,
            "micro": len(losses), "grad_norm": self._grad_norm,
            "rows": self._pending["rows"], "indices": self._pending["indices"],
            "pass": len(self.data["passes"]), "optimizer_steps": self._opt_steps,
            "lr": self._lr, "draws": None if self._draws is None else self._draws.mark()})
        self._pending = {"losses": [], "counts": [], "rows": [], "indices": []}
        self.flush()
        if self.data["first_step"] + len(self.data["steps"]) >= self.stop:
            self._write_params()
            raise SystemExit(0)  # enough steps recorded: end the script quietly

    def on_save(self, path: Path, step: int) -> None:
        self.data["saves"].append(int(step))

    def on_resume(self, path: Path | str, step: int) -> None:
        self.data["resumed_step"] = self.data["first_step"] = int(step)
        if self._draws is not None:
            self._draws.reset()

    def on_close(self, clean: bool) -> None:
        if clean and not self.data["params"] and self.data["mesh"]:
            # a TP script that ends by itself: its final weights are what verify compares
            self._write_params()
        self.flush()

    def flush(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data))
        os.replace(tmp, self.path)

    def _write_params(self) -> None:
        """The final parameters, whole (gathered from shards: every rank takes part)."""
        if self._module is None:
            return
        params = {name: _local(p.detach()).to("cpu").clone()
                  for name, p in self._module.named_parameters()}
        if self.rank == 0:
            torch.save(params, self.params_path)
        self.data["params"] = True
        self.flush()

    def _params(self) -> list[nn.Parameter]:
        return list(self._module.parameters()) if self._module is not None else []


def _step_loss(losses: list[float], counts: list[float | None],
               accumulate: int) -> tuple[float | None, float | None]:
    """The loss whose gradient the step applies, and the items it is the mean of: the mean
    over the items under count= (a micro-batch without any adds nothing), else the mean of
    the micro-steps' losses (run.backward divides each by accumulate)."""
    if not losses:
        return None, None
    if None in counts:
        return sum(losses) / accumulate, None
    total = sum(counts)  # type: ignore[arg-type]
    weighed = sum(v * n for v, n in zip(losses, counts, strict=True) if n)  # type: ignore[operator]
    return (weighed / total if total else None), total


def _module_name(m: nn.Module) -> str:
    """Type name; a dropout that drops nothing (p=0) is not reported as dropout."""
    name = type(m).__name__
    return f"{name}(p=0)" if name.startswith("Dropout") and not getattr(m, "p", 0) else name


def from_environ(environ: Mapping[str, str], rank: int, world: int,
                 accumulate: int = 1, tp: int = 1, mesh: bool = False) -> ScriptRecorder | None:
    """The recorder when ``splitsync verify`` launched this script, else None.

    ``accumulate`` is the run's (after :func:`settings`); ``tp`` its tensor-parallel size
    (``init(mesh=...)``): the ranks of a TP group train one replica's batch together, so the
    batch is split over the ``world / tp`` replicas, and each record says its ``tp_rank``;
    ``mesh``: the script gave ``init(mesh=...)`` (its final weights are written at close)."""
    out = environ.get(ENV_DIR)
    if not out:
        return None
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    batch, shared, stop = environ.get(ENV_BATCH), environ.get(ENV_SHARED), environ.get(ENV_STOP)
    recorder = ScriptRecorder(path, rank, world // tp, int(batch) if batch else None,
                              int(environ.get(ENV_STEPS, "3")), int(environ.get(ENV_EPOCHS, "2")),
                              accumulate=accumulate, shared=Path(shared) if shared else None,
                              reference=environ.get(ENV_ROLE, agree.REF) == agree.REF,
                              stop=int(stop) if stop else None,
                              timeout=float(environ.get(ENV_TIMEOUT, "300")))
    recorder.data.update({"world_size": world, "tp_size": tp, "tp_rank": rank % tp,
                          "mesh": mesh})
    recorder.flush()  # the script reached init(): verify tells this from "never called it"
    return recorder
