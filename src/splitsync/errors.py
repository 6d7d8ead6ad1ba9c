"""Every exception and warning splitsync raises, in one place.

Each is also importable from the module that raises it (``splitsync.ckpt.CheckpointError``,
``splitsync.distributed.env.EnvError``, ...) and from the package top
(``splitsync.CheckpointError``), as documented. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "CheckpointError", "CheckpointWarning", "DataParallelWarning", "StaleOptimizerError",
    "SpawnError", "EnvError", "GroupError", "DesyncError", "ConfigMismatchError",
    "ParameterMismatchError", "DeviceMismatchError", "CollectiveTimeoutError", "LaunchError",
    "LaunchFailed", "Preempted",
]


# --- launchers and the process group ----------------------------------------------------
class EnvError(ValueError):
    """A launcher variable is missing, malformed or inconsistent."""


class GroupError(RuntimeError):
    """The process group could not be formed."""


class LaunchError(ValueError):
    """An option of ``splitsync run`` is invalid; the message says how to fix it."""


class LaunchFailed(RuntimeError):
    """A rank raised (or died); ``rank`` is the first that failed, ``details`` its traceback."""

    def __init__(self, message: str, rank: int, details: str) -> None:
        super().__init__(message)
        self.rank = rank
        self.details = details


class SpawnError(RuntimeError):
    """A rank failed or did not finish in time."""


# --- training ---------------------------------------------------------------------------
class StaleOptimizerError(RuntimeError):
    """The optimizer would update parameters the wrapped model no longer uses."""


class DataParallelWarning(UserWarning):
    """Notes about nn.DataParallel (shown once per process by the default filters)."""


# --- checkpoints ------------------------------------------------------------------------
class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or does not fit what it should be loaded into."""


class CheckpointWarning(UserWarning):
    """A checkpoint was skipped (incomplete or corrupted) while looking for one to resume."""


class Preempted(SystemExit):
    """A preemption signal stopped the run after an agreed step (``splitsync.preemption``).

    A ``SystemExit``: nothing catches it by accident, ``with splitsync.init()`` closes the
    run cleanly, and the process exits with ``code`` (``PREEMPTED_EXIT_CODE``, 75; 0 under
    ``splitsync run``, which exits with 75 itself). ``step`` is the optimizer step the run
    stopped after, ``path`` the checkpoint that holds it."""

    def __init__(self, code: int, step: int, path: object = None) -> None:
        super().__init__(code)
        self.step = step
        self.path = path


# --- guards -----------------------------------------------------------------------------
class DesyncError(RuntimeError):
    """Ranks made different collective calls (different op, shape or call site)."""

    def __init__(self, message: str, diverged: list[int], call: int) -> None:
        super().__init__(message)
        self.diverged = diverged
        self.call = call


class ConfigMismatchError(RuntimeError):
    """Ranks were started with different arguments or splitsync settings."""


class ParameterMismatchError(RuntimeError):
    """Ranks hold different initial parameters."""


class DeviceMismatchError(RuntimeError):
    """A forward received tensors on more than one device."""


class CollectiveTimeoutError(RuntimeError):
    """A collective did not complete: some ranks never arrived or were at another call."""

    def __init__(self, message: str, missing: Sequence[int] = (),
                 out_of_step: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.missing = list(missing)
        self.out_of_step = list(out_of_step)
