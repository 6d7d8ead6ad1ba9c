"""``splitsync plan --failures``: goodput under failures, and the best checkpoint interval.

Goodput is the share of the machines' time spent in steps that count. With failures at rate
``lam = nodes / mtbf`` (``mtbf`` per node), checkpoints that stall ``save`` seconds every
``interval`` seconds of training, and ``restart`` seconds from a failure until the job trains
again (launch, imports, rendezvous, loading the checkpoint):

**Restart-based** (every failure stops the job, which resumes from its last checkpoint and
redoes the work since): Daly's model for Poisson failures (J. T. Daly, "A higher order
estimate of the optimum checkpoint interval for restart dumps", FGCS 2006),

    goodput = interval / (M e^(restart/M) (e^((interval + save)/M) - 1)),   M = 1 / lam,

best at Daly's interval ``sqrt(2 save M)(1 + sqrt(save/2M)/3 + save/18M) - save`` (Young's
``sqrt(2 save M)`` to first order). For failures that come at a fixed period instead, a
failure costs the restart plus on average half an interval:
``interval/(interval+save) * (1 - lam (restart + (interval+save)/2))``.

**Fault tolerant** (torchft, ``groups`` replica groups): a failure takes one group down; it
costs the survivors the heartbeat timeout and the step it spoiled, every group one live
recovery, and the dead group the time until it trains again (``rejoin``: its restart and
recovery). In group-seconds per failure: ``(groups-1)(heartbeat + step) + groups*heal +
rejoin``; over ``groups`` groups a share ``lam * that / groups`` of the time. Checkpoints
are then only for losing every group at once (rate ``groups lam_g (lam_g rejoin)^(groups-1)``,
``lam_g = lam / groups``; none for periodic failures a rejoin apart), so their best interval
is long; each still stalls every group.
A quorum before every step costs ``quorum / step`` on top.

``startup`` (the first launch's start, paid once) and ``work`` (the job's useful compute in
seconds) turn the steady share into the whole job's: ``work / (startup + work / goodput)``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["FailureInputs", "Plan", "daly_interval", "young_interval", "restart_goodput",
           "ft_goodput", "plan_failures", "PATTERNS"]

PATTERNS = ("poisson", "periodic")
MAX_INTERVAL = 86400.0  # the longest interval suggested between checkpoints, seconds


@dataclass(frozen=True)
class FailureInputs:
    nodes: int
    mtbf: float  # seconds between failures of one node
    save: float  # seconds a checkpoint stalls training
    restart: float  # seconds from a failure until the restarted job trains again
    step: float = 1.0  # seconds per step
    groups: int = 2  # replica groups (fault tolerant)
    heartbeat: float = 1.0  # the Lighthouse's heartbeat timeout, seconds
    heal: float = 0.2  # a live recovery, seconds (every group pauses for it)
    rejoin: float | None = None  # a failed group's restart + recovery (default: restart)
    quorum: float = 0.0  # a quorum's cost per step, seconds
    startup: float = 0.0  # the first launch's start, paid once
    work: float | None = None  # useful compute of the whole job, seconds (None: long)
    pattern: str = "poisson"

    def __post_init__(self) -> None:
        for name in ("mtbf", "step"):
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name}: give a positive number of seconds.")
        for name in ("save", "restart", "heartbeat", "heal", "quorum", "startup"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"--{name.replace('_', '-')}: give seconds >= 0.")
        if self.nodes < 1 or self.groups < 1:
            raise ValueError("--nodes and --replica-groups must be >= 1.")
        if self.pattern not in PATTERNS:
            raise ValueError(f"--failure-pattern {self.pattern!r}: one of {PATTERNS}.")

    @property
    def rate(self) -> float:
        """Failures per second of the whole job."""
        return self.nodes / self.mtbf


@dataclass(frozen=True)
class Plan:
    mode: str  # "restart" or "fault tolerant"
    interval: float  # seconds of training between checkpoints
    goodput: float  # steady share of the time in steps that count
    job_goodput: float  # with the first launch's start (and the job's length) counted
    per_failure: float  # seconds (group-seconds / groups) one failure costs
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def young_interval(save: float, mtbf: float) -> float:
    return math.sqrt(2 * save * mtbf)


def daly_interval(save: float, mtbf: float) -> float:
    """Daly's higher-order optimum (``mtbf`` of the whole job)."""
    if save >= 2 * mtbf:
        return mtbf
    x = save / (2 * mtbf)
    return math.sqrt(2 * save * mtbf) * (1 + math.sqrt(x) / 3 + x / 9) - save


def _steady(interval: float, save: float, restart: float, mtbf: float, pattern: str) -> float:
    if pattern == "periodic":
        share = 1 - (restart + (interval + save) / 2) / mtbf
        return max(0.0, interval / (interval + save) * share)
    try:
        wall = mtbf * math.exp(restart / mtbf) * math.expm1((interval + save) / mtbf)
    except OverflowError:
        return 0.0
    return interval / wall if wall > 0 else 0.0


def _job(goodput: float, inputs: FailureInputs) -> float:
    if inputs.work is None or goodput <= 0:
        return goodput
    return inputs.work / (inputs.startup + inputs.work / goodput)


def restart_goodput(inputs: FailureInputs, interval: float | None = None) -> Plan:
    """The restart-based run at ``interval`` (None: the best one)."""
    mtbf = 1 / inputs.rate
    if interval is None:
        interval = daly_interval(inputs.save, mtbf) if inputs.save > 0 else inputs.step
        interval = max(interval, inputs.step)
    g = _steady(interval, inputs.save, inputs.restart, mtbf, inputs.pattern)
    lost = inputs.restart + (interval + inputs.save) / 2
    return Plan("restart", interval, g, _job(g, inputs), lost,
                f"Young's interval {young_interval(inputs.save, mtbf):.1f}s")


def ft_goodput(inputs: FailureInputs, interval: float | None = None) -> Plan:
    """The fault-tolerant run at ``interval`` (None: the best one for losing every group)."""
    groups = inputs.groups
    rejoin = inputs.restart if inputs.rejoin is None else inputs.rejoin
    lam = inputs.rate
    per_failure = ((groups - 1) * (inputs.heartbeat + inputs.step) + groups * inputs.heal
                   + rejoin) / groups
    lam_g = lam / groups
    if inputs.pattern == "periodic":  # one at a time: overlap only if a group is not back yet
        catastrophic = 0.0 if groups > 1 and 1 / lam >= rejoin else lam
    else:
        catastrophic = groups * lam_g * (lam_g * rejoin) ** (groups - 1) if groups > 1 else lam
    m_cat = 1 / catastrophic if catastrophic > 0 else math.inf
    if interval is None:  # (at most a day: other hazards than failures exist too)
        interval = daly_interval(inputs.save, m_cat) if inputs.save > 0 else MAX_INTERVAL
        interval = max(min(interval, MAX_INTERVAL, inputs.work or MAX_INTERVAL), inputs.step)
    saving = interval / (interval + inputs.save)
    whole = (_steady(interval, inputs.save, inputs.restart, m_cat, "poisson") / saving
             if math.isfinite(m_cat) else 1.0)
    quorum = inputs.step / (inputs.step + inputs.quorum)
    g = max(0.0, saving * whole * quorum * (1 - lam * per_failure))
    note = (f"every replica group down at once about every {m_cat / 3600:.3g} h"
            if math.isfinite(m_cat) else "never every replica group down at once")
    return Plan("fault tolerant", interval, g, _job(g, inputs), per_failure, note)


def plan_failures(inputs: FailureInputs, interval: float | None = None) -> list[Plan]:
    """Both kinds of run, each at its best interval, plus at ``interval`` when given."""
    plans = [restart_goodput(inputs), ft_goodput(inputs)]
    if interval is not None:
        plans += [restart_goodput(inputs, interval), ft_goodput(inputs, interval)]
    return plans
