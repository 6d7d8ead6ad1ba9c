"""The walk of ``run.save(dir)``: which splitsync modules a save passes through.

Traces every Python call into ``splitsync.*`` while ``run.save`` runs, blocking and in the
background (each after one untraced warm-up save, so lazy imports and first-save buffer
allocation do not count), in one process. The background save's own thread is traced too.
Prints the modules entered, in order of first entry, and how many there are. Uses only the
public API, so the same script measures any version of the package.

    OMP_NUM_THREADS=1 python benchmarks/save_walk.py
"""

from __future__ import annotations

import sys
import tempfile
import threading
from typing import Any

import torch

import splitsync as ss


def _walk(action: Any) -> list[str]:
    seen: list[str] = []

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if event == "call":
            name = frame.f_globals.get("__name__", "")
            if name.startswith("splitsync.") and name not in seen:
                seen.append(name)
        return None

    sys.setprofile(tracer)
    threading.setprofile(tracer)
    try:
        action()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    return seen


def main() -> None:
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp, ss.init(seed=0) as run:
        model = run.model(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        run.resume(f"{tmp}/ck", model=model, optimizer=opt)
        def train() -> None:
            model(torch.randn(4, 8)).sum().backward()
            run.step(opt)

        for blocking in (True, False):
            def save(blocking: bool = blocking) -> None:
                handle = run.save(blocking=blocking)
                if handle is not None and hasattr(handle, "wait"):
                    handle.wait()

            train()
            save()  # warm-up: imports, first-save buffers
            train()
            mods = _walk(save)
            kind = "blocking" if blocking else "background"
            print(f"run.save ({kind}): {len(mods)} modules")
            for m in mods:
                print(f"  {m}")


if __name__ == "__main__":
    main()
