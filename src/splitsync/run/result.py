"""What ``run.step`` returns: :class:`StepResult` (whether it stepped, and the norm)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["StepResult", "STEPPED", "NOT_STEPPED"]


@dataclass(frozen=True, slots=True)
class StepResult:
    """What ``run.step`` did. ``stepped``: the optimizer stepped (False on an accumulation
    micro-step and on a step the GradScaler skipped for inf/nan gradients); ``norm``: the
    global gradient norm before clipping when ``clip`` was given and the step reached the
    clip, else None. True in a condition exactly when it stepped; ``float(result)`` is the
    norm (what ``run.step`` used to return)."""

    stepped: bool
    norm: torch.Tensor | None = None

    def __bool__(self) -> bool:
        return self.stepped

    def __float__(self) -> float:
        if self.norm is None:
            why = "give run.step(opt, clip=...)" if self.stepped else \
                "it did not step (an accumulation micro-step or a skipped step)"
            raise TypeError(f"this run.step has no gradient norm: {why}; check "
                            "result.stepped / result.norm first.")
        return float(self.norm)


# No allocation on the steps without a norm, the common case.
STEPPED, NOT_STEPPED = StepResult(True), StepResult(False)
