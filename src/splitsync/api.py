"""``splitsync.init()``: detect the launcher, form the group, and assemble the :class:`Run`.

The observers a run gets (guards, straggler clock, sample ledger, ``splitsync verify``'s
recorder) come from :mod:`splitsync.observers`, which reads their settings; neither this
module nor the core (``runtime`` and the Run's parts) names them.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from splitsync import observers as attached
from splitsync.distributed import comm
from splitsync.distributed.device import choose_device, default_backend
from splitsync.distributed.env import DistEnv, batch_note, detect_env
from splitsync.distributed.group import destroy_group, init_group
from splitsync.distributed.logs import attach_rank_handler, get_logger
from splitsync.distributed.mesh import MeshShape, build_mesh, mesh_shape, tp_spans_nodes
from splitsync.distributed.rankstate import flight_recorder_env
from splitsync.distributed.seeding import draw_seed, seed_everything
from splitsync.distributed.threads import cpu_counts, launcher_threads
from splitsync.output.progress import preload as preload_progress
from splitsync.output.trackers import require_packages
from splitsync.preemption.defaults import DEFAULT_PREEMPT_GRACE, DEFAULT_PREEMPT_SIGNALS
from splitsync.preemption.settings import PreemptionSettings
from splitsync.run.config import (
    DEFAULT_STRAGGLER_THRESHOLD,
    CheckpointSettings,
    GuardSettings,
    LedgerSettings,
    RunConfig,
    accumulate_for,
)
from splitsync.run.runtime import Run
from splitsync.strategies import check_options, resolve
from splitsync.train.precision import precision_on

__all__ = ["init"]


def init(*, seed: int | None = None, strategy: str = "auto", precision: str = "32",
         device: str | torch.device | None = None, backend: str | None = None,
         accumulate: int | Callable[[int], int] = 1, timeout: float | timedelta = timedelta(minutes=10),
         debug: bool = False, guards: bool = True, desync_after: float | None = None,
         run_dir: str | None = None, deterministic: bool = False, loggers: str | list[str] | tuple[str, ...] | None = None,
         straggler_threshold: float | None = DEFAULT_STRAGGLER_THRESHOLD,
         save_blocking: bool = True, ledger: bool = False,
         fault_tolerance: str | None = None, ft_min_replicas: int = 1,
         ft_heartbeat_ms: int = 100, ft_timeout: float = 30.0,
         ft_lighthouse: str | None = None,
         preempt_signals: Sequence[str | int] | None = DEFAULT_PREEMPT_SIGNALS,
         preempt_grace: float = DEFAULT_PREEMPT_GRACE, preempt_file: str | None = None,
         mesh: Mapping[str, int] | None = None, **strategy_options: Any) -> Run:
    """Detect the launcher, pick the device, form the process group and seed every RNG;
    returns the :class:`Run`. Every keyword is described below (``help(splitsync.init)``)."""
    given = dict(locals())  # every keyword, under its own name
    env = detect_env()  # validated before any network call
    chosen = _settings(env, given)  # every setting, checked once; "auto" resolved once
    config = chosen.config
    dev = choose_device(env, device)
    policy = precision_on(config.precision, dev)  # "16-mixed" on a CPU fails here
    chosen_backend = backend or default_backend(dev)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    owns = False
    if env.launcher != "none":
        # NCCL's flight recorder under splitsync run: read when the group is made, below
        os.environ.update(flight_recorder_env(os.environ, chosen_backend, config.run_dir, env.rank))
        # with guards on, collectives wait a little less so the explained error fits in
        owns = init_group(env, chosen_backend, dev, attached.collective_timeout(config, env.world_size))
    try:
        device_mesh = _device_mesh(config.mesh, env, dev)  # a collective: every rank, now
        if config.deterministic:
            torch.use_deterministic_algorithms(True)
        final_seed = config.seed if config.seed is not None else comm.broadcast_object(draw_seed())
        if env.rank == 0:
            preload_progress()  # before the seeding: its draws at import change nothing
        seed_everything(final_seed)
        handler = attach_rank_handler(env.rank, env.world_size)
        for note in (chosen.threads_note, batch_note(os.environ, env)):
            if note and env.rank == 0:
                get_logger().info(note)
        config, observers = attached.attach(config, env, dev, final_seed, os.environ)
    except BaseException:
        if owns:
            destroy_group()
        raise
    # under fault tolerance the Run builds its part from config.fault_tolerance
    run = Run(config, env, dev, chosen_backend, final_seed, owns, handler, precision=policy,
              observers=observers, strategy=chosen.strategy, device_mesh=device_mesh)
    # A run never closed (``run = ss.init()`` without ``with`` or ``run.close()``) closes
    # itself at interpreter exit, before torch's own exit work and the teardown of its
    # threads and stores; ``run.close()`` takes this back.
    atexit.register(run._close_at_exit)
    return run


init.__doc__ = """Detect the launcher, pick the device, form the process group and seed every RNG.

``loggers`` picks the trackers ``run.log`` writes to ("jsonl", "csv", "tensorboard",
"wandb", "mlflow"; None: JSONL, CSV and TensorBoard under ``run_dir``). ``run.log``
reports the slowest rank when the others wait for it more than ``straggler_threshold``
of each step (None: no report, and no clock). ``save_blocking=False`` makes ``run.save``
write checkpoints in the background. ``ledger=True`` records which samples every
optimizer step trained on every rank under ``run_dir/ledger`` (``splitsync audit``).

``preempt_signals`` (default SIGTERM and SIGUSR1; None or () for none): once
``run.resume`` has a checkpoint directory, any of them on any rank stops every rank
after one agreed optimizer step, saved, and the process exits with
``PREEMPTED_EXIT_CODE`` (75); ``preempt_grace`` seconds from the signal to reach that
step, else the run exits with its previous checkpoint (docs/checkpoints.md#preemption).
``preempt_file``: a path whose appearance (``touch``, e.g. from a Kubernetes preStop
hook) stops the run the same way.

``desync_after`` (default 20 s, or ``SPLITSYNC_DESYNC_AFTER``): with guards on, a rank
that has waited this long in one collective asks where the others are; if they are at
another call, or outside any collective, every rank stops at once with a summary instead
of waiting for ``timeout`` (docs/guards-and-verify.md#what-a-hang-looks-like).

``accumulate``: micro-batches per optimizer step on each process, or a function of the
world size that returns it (``accumulate=lambda world_size: 40 // world_size`` keeps 40
micro-batches per step in all, as nanoGPT does), called once the launcher is known.
``fault_tolerance="torchft"``: this process is one rank of one replica group, and the
job trains on through the loss of a group (docs/fault-tolerance.md; ``splitsync run
--replica-groups R``). ``ft_min_replicas``: groups a step needs to count;
``ft_heartbeat_ms``: how often the group tells the Lighthouse it is alive;
``ft_timeout``: seconds a cross-group all-reduce, commit or recovery may take;
``ft_lighthouse``: the Lighthouse's address (default: ``TORCHFT_LIGHTHOUSE``).

``mesh={"dp_replicate": 1, "dp_shard": -1, "tp": 2}``: one N-D ``DeviceMesh``
(``run.mesh``) with data-parallel replicate and shard sizes and a tensor-parallel size
(-1: the rest of the world size); ``run.model(m, tp_plan=...)`` splits the model over
``tp`` and shards it over the data-parallel dimensions, and loaders deal batches over
the data-parallel replicas only (docs/tensor-parallel.md).

Any other keyword is a strategy option (DDP's ``find_unused_parameters``, ...): one
that the strategy does not take is refused here, naming the nearest valid keyword.

"""  # the keyword reference, kept out of the body so that init fits on a screen


@dataclass(frozen=True)
class _Chosen:
    """What :func:`_settings` made of init's keywords."""

    config: RunConfig
    strategy: str  # config.strategy resolved for this world size ("auto" -> "ddp"/"single")
    threads_note: str | None  # what init set OMP_NUM_THREADS to, and why


def _settings(env: DistEnv, given: dict[str, Any]) -> _Chosen:
    """init's keywords as one checked :class:`RunConfig` (its sub-settings parsed once:
    checkpointing, preemption, fault tolerance, guards, ledger), in the order init checks
    them; the strategy resolved, once."""
    threads = launcher_threads(env, os.environ, *cpu_counts())  # srun, mpirun: unset
    if threads is not None:
        # torch sized its thread pool at `import torch`, before init could export the
        # variable: resize the pool itself, and export it for the processes this one starts
        torch.set_num_threads(threads.count)
        os.environ["OMP_NUM_THREADS"] = str(threads.count)
    ft = None
    if given["fault_tolerance"] is not None:
        from splitsync.ft.options import check_launch, ft_options

        ft = ft_options(given["fault_tolerance"], os.environ,
                        min_replicas=given["ft_min_replicas"],
                        heartbeat_ms=given["ft_heartbeat_ms"], timeout=given["ft_timeout"],
                        lighthouse=given["ft_lighthouse"])
        check_launch(accumulate_for(given["accumulate"], env.world_size), env.launcher)
    given["mesh"] = attached.imposed_mesh(given["mesh"], env.world_size, os.environ)
    shape = _mesh(given, env.world_size, ft is not None)  # checked by mesh_shape
    device = given["device"]
    options = given["strategy_options"]
    config = RunConfig(  # each sub-settings object checks its own values, once
        seed=given["seed"], strategy=given["strategy"], precision=given["precision"],
        device=None if device is None else str(device), backend=given["backend"],
        accumulate=accumulate_for(given["accumulate"], env.world_size),
        run_dir=given["run_dir"], deterministic=given["deterministic"],
        strategy_options=options, loggers=given["loggers"],
        checkpointing=CheckpointSettings(save_blocking=given["save_blocking"]),
        preemption=PreemptionSettings(preempt_signals=given["preempt_signals"],
                                      preempt_grace=given["preempt_grace"],
                                      preempt_file=given["preempt_file"]),
        fault_tolerance=ft,
        guarding=GuardSettings(guards=given["guards"], timeout=given["timeout"],
                               debug=given["debug"], desync_after=given["desync_after"],
                               straggler_threshold=given["straggler_threshold"]),
        sample_ledger=LedgerSettings(ledger=given["ledger"]), mesh=shape)
    config = attached.configure(config, os.environ)  # a tool may impose strategy, accumulate
    strategy = resolve(config.strategy, env.world_size)
    if options:  # a misspelt keyword fails here, at every world size
        check_options(config.strategy, strategy, options, where="splitsync.init()",
                      parameters=_keywords())
    if config.loggers is not None:
        require_packages(config.loggers)  # a missing package fails now, not mid-run
    return _Chosen(config, strategy, threads and threads.note)


def _mesh(given: dict[str, Any], world_size: int, ft: bool) -> MeshShape | None:
    """``mesh=`` checked against the world size (before any network call); under a mesh the
    strategy is "tp" (``given["strategy"]`` is set to it)."""
    mesh, strategy = given["mesh"], given["strategy"]
    if mesh is None:
        if strategy == "tp":
            raise ValueError("strategy='tp' lays the model out on init(mesh=...): pass mesh="
                             "{'dp_shard': -1, 'tp': 2} (the sizes of your job) instead.")
        return None
    shape = mesh_shape(mesh, world_size)
    if ft:
        raise ValueError("init(mesh=...) and fault_tolerance='torchft' do not combine yet: "
                         "a replica group is one data-parallel replica; drop one of them.")
    if strategy not in ("auto", "tp"):
        raise ValueError(f"init(mesh=...) lays the model out itself (tensor-parallel over "
                         f"tp, FSDP2 over dp_replicate x dp_shard): drop strategy="
                         f"{strategy!r}, or drop mesh= to use it.")
    given["strategy"] = "tp"
    return shape


def _device_mesh(shape: MeshShape | None, env: DistEnv, dev: torch.device) -> Any:
    """The job's DeviceMesh under ``init(mesh=...)`` (None without one, or in one process);
    rank 0 warns when a tensor-parallel group would span nodes."""
    if shape is None or env.world_size == 1:
        return None
    if env.rank == 0 and tp_spans_nodes(shape, env.local_world_size):
        get_logger().warning(
            f"init(mesh=...): tp={shape.tp} does not divide the {env.local_world_size} "
            "processes of a node, so tensor-parallel groups span nodes and every layer's "
            "all-reduce crosses the network; make tp a divisor of the processes per node.")
    return build_mesh(shape, dev.type)


def _keywords() -> tuple[str, ...]:
    """init()'s own keywords, for "did you mean" (read from its signature, so never stale)."""
    import inspect

    return tuple(n for n, p in inspect.signature(init).parameters.items()
                 if p.kind is p.KEYWORD_ONLY)
