"""How many draws a step took from the global generators: the evidence for random
augmentation as a cause of divergence.

Python's ``random`` and NumPy's legacy ``np.random`` are Mersenne Twisters whose state
holds its position in a block of 624 32-bit words, so the words drawn between two states
are ``(pos_after - pos_before) mod 624`` plus whole blocks: each candidate is tried on a
copy (one C call draws n words) until it gives the later state. torch's CPU generator is
only compared (drew or not): a count would need its private layout.
"""

from __future__ import annotations

import random
from typing import Any

import torch

__all__ = ["Draws", "words_between"]

_N = 624  # words in a Mersenne Twister block
MOST = 1 << 18  # counts beyond this are reported as -1 (drew, too many to count)


def words_between(before: tuple[Any, ...], after: tuple[Any, ...]) -> int:
    """32-bit words Python's generator drew from state ``before`` to ``after`` (-1: more
    than ``MOST``, or ``after`` does not follow ``before``)."""
    if before == after:
        return 0
    copy = random.Random()
    n = (after[1][-1] - before[1][-1]) % _N or _N
    while n <= MOST:
        copy.setstate(before)
        copy.getrandbits(32 * n)
        if copy.getstate() == after:
            return n
        n += _N
    return -1


def _numpy_words(before: Any, after: Any) -> int:
    import numpy as np

    if before[2] == after[2] and np.array_equal(before[1], after[1]) and \
            before[3] == after[3]:
        return 0
    copy = np.random.RandomState()
    n = (int(after[2]) - int(before[2])) % _N or _N
    while n <= MOST:
        copy.set_state(before)
        copy.bytes(4 * n)  # 4 bytes a word
        now = copy.get_state()
        if now[2] == after[2] and np.array_equal(now[1], after[1]):
            return n
        n += _N
    return -1


class Draws:
    """The global generators' states at the last mark, and the draws since."""

    def __init__(self) -> None:
        self._last = self._states()

    @staticmethod
    def _states() -> dict[str, Any]:
        states: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
        try:
            import numpy as np
        except ImportError:
            return states
        states["numpy"] = np.random.get_state()
        return states

    def mark(self) -> dict[str, int]:
        """Draws since the last mark: Python and NumPy in words (-1: drew, not counted),
        torch 1 if it drew at all."""
        now = self._states()
        last, self._last = self._last, now
        out = {"python": words_between(last["python"], now["python"]),
               "torch": int(not torch.equal(last["torch"], now["torch"]))}
        if "numpy" in now:
            out["numpy"] = _numpy_words(last["numpy"], now["numpy"])
        return out

    def reset(self) -> None:
        """Forget the draws since the last mark (a resume sets the states anew)."""
        self._last = self._states()
