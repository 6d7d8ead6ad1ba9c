"""Runtime guards: cheap checks that turn the classic data-parallel mistakes into clear errors.

On by default, off with ``splitsync.init(guards=False)``. They act at ``init()`` (arguments and
configuration agree on all ranks), at ``run.model()`` (initial parameters agree; a forward that
mixes devices is explained) and when a collective fails (which rank never arrived, or which
ranks are at different collectives). On a good run the per-step cost is one Python call.

A rank that waits ``desync_after`` seconds (default 20) in one collective asks the others
where they are; ranks out of step stop at once with each rank's state and line
(:mod:`~splitsync.observers.guards.waits`), not at the timeout.

GPU notes: with NCCL, PyTorch's watchdog already aborts a collective that exceeds the timeout
(``TORCH_NCCL_ASYNC_ERROR_HANDLING``, on by default). Its flight recorder keeps the last
collectives of every rank: ``splitsync run`` turns it on for NCCL jobs (dumps on timeout under
``run_dir/flight_recorder``); under torchrun or srun set ``TORCH_FR_BUFFER_SIZE=2000`` and
``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` (dumps go to ``TORCH_FR_DUMP_TEMP_FILE``) before launching,
and read them with ``python -m torch.distributed.flight_recorder.fr_trace``. splitsync's own
monitored barrier and hang diagnosis run on a side gloo group and the job's store, so they
work on GPUs too.
"""

from __future__ import annotations

from splitsync.observers.guards.consistency import (
    ConfigMismatchError,
    ParameterMismatchError,
    check_same_config,
    check_same_parameters,
    config_summary,
    param_fingerprints,
)
from splitsync.observers.guards.devices import DeviceMismatchError, guard_forward, is_device_error
from splitsync.observers.guards.hangs import (
    CollectiveTimeoutError,
    Position,
    Watch,
    is_comm_failure,
)
from splitsync.observers.guards.site import user_site

__all__ = [
    "ConfigMismatchError",
    "ParameterMismatchError",
    "DeviceMismatchError",
    "CollectiveTimeoutError",
    "Position",
    "Watch",
    "check_same_config",
    "check_same_parameters",
    "config_summary",
    "param_fingerprints",
    "guard_forward",
    "is_device_error",
    "is_comm_failure",
    "user_site",
]
