"""examples/clm_no_trainer.py with rank 1 killed (SIGKILL) right after the first attempt's
checkpoint of a given step, for a launch under ``splitsync run --max-restarts 1``:

    splitsync run -n 2 --max-restarts 1 tests/launcher/clm_kill.py STEP [example args...]

The example itself is untouched: ``ss.init`` is wrapped to attach the killer as an
observer (``on_save``), and the example runs as ``__main__``.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
from pathlib import Path
from typing import Any

import splitsync as ss
from splitsync.observe import Observer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "clm_no_trainer.py"


class KillAfterSave(Observer):
    def __init__(self, run: Any, step: int) -> None:
        self.run, self.step = run, step

    def on_save(self, path: Any, step: int) -> None:
        if step == self.step and self.run.rank == 1 and self.run.env.restart_count == 0:
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    step, args = int(sys.argv[1]), sys.argv[2:]
    init = ss.init

    def init_with_killer(*a: Any, **k: Any) -> Any:
        run = init(*a, **k)
        run.add_observer(KillAfterSave(run, step))
        return run

    ss.init = init_with_killer  # type: ignore[assignment]
    sys.argv = [str(EXAMPLE), *args]
    runpy.run_path(str(EXAMPLE), run_name="__main__")


if __name__ == "__main__":
    main()
