"""The preemption settings' defaults and their checks, shared by ``init`` and the launcher.

``splitsync run``'s agent must pass on every signal a run stops on (left to its default,
SIGUSR1 would end the agent at once), and the test spawner's stack-dump signal must be none
of them: both read the list here, so the three cannot disagree. The agent's wait for its
workers to save (``--shutdown-timeout``) is the default grace and a margin, here too.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable
from typing import Any

__all__ = ["DEFAULT_PREEMPT_SIGNALS", "DEFAULT_PREEMPT_GRACE", "DEFAULT_SHUTDOWN_TIMEOUT",
           "AGENT_SIGNALS",
           "DUMP_SIGNAL_NAME", "parse_signals", "check_grace"]

#: Signals that stop a run at an agreed step: SIGTERM (scancel, time limits, Kubernetes,
#: torchrun's agent forwarding its own SIGTERM) and SIGUSR1 (SLURM's ``--signal=USR1@N``).
DEFAULT_PREEMPT_SIGNALS: tuple[str, ...] = ("SIGTERM", "SIGUSR1")

#: Seconds from the signal within which the run must reach its stop step; under SLURM's
#: default KillWait (30 s), with 10 s left for the stop's checkpoint and the exit.
DEFAULT_PREEMPT_GRACE = 20.0

#: Seconds ``splitsync run``'s agent waits for its workers after passing on a stop signal,
#: before SIGKILL: the default grace and 10 s for the stop's checkpoint and the exit.
DEFAULT_SHUTDOWN_TIMEOUT = int(DEFAULT_PREEMPT_GRACE) + 10

# torchrun's agent forwards these to its workers by default (--signals-to-handle).
_TORCHRUN_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")

#: The signals ``splitsync run``'s agent passes on to its workers, then waits
#: --shutdown-timeout for them: torchrun's own list plus the default preemption signals.
AGENT_SIGNALS = ",".join(dict.fromkeys((*_TORCHRUN_SIGNALS, *DEFAULT_PREEMPT_SIGNALS)))

#: The signal a hung test rank is sent to dump its stacks: one no run stops on by default.
DUMP_SIGNAL_NAME = "SIGUSR2"

_FIX = ("give signal names or numbers, e.g. preempt_signals=('SIGTERM', 'SIGUSR1'), or () to "
        "turn preemption handling off")
_UNCATCHABLE = {signal.SIGKILL, signal.SIGSTOP}


def parse_signals(value: Iterable[str | int] | str | int | None) -> tuple[signal.Signals, ...]:
    """``init(preempt_signals=...)`` as signals: names (``"SIGTERM"``, ``"USR1"``) or
    numbers; None or () for none. Unknown names and uncatchable signals are refused."""
    if value is None:
        return ()
    if isinstance(value, (str, int)):
        value = (value,)
    out: list[signal.Signals] = []
    for item in value:
        try:
            if isinstance(item, bool):
                raise ValueError(item)
            if isinstance(item, int):
                sig = signal.Signals(item)
            else:
                name = str(item).strip().upper()
                sig = signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]
        except (KeyError, ValueError):
            raise ValueError(f"preempt_signals: {item!r} is not a signal; {_FIX}.") from None
        if sig in _UNCATCHABLE:
            raise ValueError(f"preempt_signals: {sig.name} cannot be caught; {_FIX}.")
        if sig not in out:
            out.append(sig)
    return tuple(out)


def check_grace(value: Any) -> float:
    """``init(preempt_grace=...)``: a positive number of seconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"preempt_grace={value!r}: give the seconds a run has, from the "
                         "signal, to reach its stop step (a number > 0; "
                         f"default {DEFAULT_PREEMPT_GRACE:g}, under SLURM's KillWait of 30 s).")
    return float(value)
