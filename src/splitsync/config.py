"""The run's configuration: one frozen dataclass, validated once at init()."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from splitsync.precision import PRECISIONS, check_precision_name
from splitsync.strategies import STRATEGY_NAMES

__all__ = ["RunConfig", "PRECISIONS"]


@dataclass(frozen=True)
class RunConfig:
    """Everything the user chose at ``splitsync.init``."""

    seed: int | None = None
    strategy: str = "auto"
    precision: str = "32"
    device: str | None = None
    backend: str | None = None
    accumulate: int = 1
    timeout: timedelta = timedelta(minutes=10)
    debug: bool = False
    guards: bool = True
    run_dir: str | None = None
    deterministic: bool = False
    save_blocking: bool = True  # run.save's default; False: background saves
    strategy_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGY_NAMES:
            raise ValueError(
                f"Unknown strategy {self.strategy!r}. Valid strategies: "
                f"{', '.join(STRATEGY_NAMES)}."
            )
        check_precision_name(self.precision)
        if not isinstance(self.accumulate, int) or self.accumulate < 1:
            raise ValueError(
                f"accumulate={self.accumulate!r}: give the number of micro-batches per "
                "optimizer step, an integer >= 1."
            )
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"seed={self.seed!r}: give a non-negative integer or None.")
