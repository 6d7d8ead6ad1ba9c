"""How often does a run that is never closed exit cleanly? Launches a script that calls
``run = ss.init()`` without ``with`` and without ``run.close()`` N times at 2 ranks, with
one core kept busy by a loop, and counts the exit codes.

Scripts: ``bare`` (init, a model, a few steps, run.log) and ``save`` (the same with a
loader and background saves, the last still in flight at exit:
``tests/launcher/scripts/unclosed_run.py``). Launchers: ``splitsync`` (``splitsync run -n
2``) and ``torchrun`` (``torchrun --standalone --nproc-per-node 2``).

    OMP_NUM_THREADS=1 python benchmarks/unclosed_exit.py [--launches 20] [--script save]
        [--launcher splitsync]

Figures (2-core machine, load average 20-40 from other jobs, plus the busy loop):
before (main, no atexit close): the save script exited 134 ("terminate called without an
active exception") in 5 of 8 launches and hung in 1; with ``init`` registering
``run.close()`` at exit: see the note in the branch's report.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BARE = """
import torch
import splitsync as ss

run = ss.init(seed=0)
model = run.model(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    run.backward(model(torch.randn(2, 4)).sum())
    run.step(opt)
run.log(loss=1.0)
run.print("done")
"""
SAVE = Path(__file__).resolve().parents[1] / "tests" / "launcher" / "scripts" / "unclosed_run.py"


def command(launcher: str, script: Path, ckpt: Path) -> list[str]:
    if launcher == "torchrun":
        head = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "2"]
    else:
        head = [sys.executable, "-m", "splitsync", "run", "-n", "2"]
    return [*head, str(script), str(ckpt)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=20)
    ap.add_argument("--script", choices=("bare", "save"), default="save")
    ap.add_argument("--launcher", choices=("splitsync", "torchrun"), default="splitsync")
    ap.add_argument("--timeout", type=float, default=180)
    args = ap.parse_args()
    codes: collections.Counter[str] = collections.Counter()
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with tempfile.TemporaryDirectory() as tmp:
            script = SAVE
            if args.script == "bare":
                script = Path(tmp) / "bare.py"
                script.write_text(BARE)
            for i in range(args.launches):
                t = time.monotonic()
                proc = subprocess.Popen(command(args.launcher, script, Path(tmp) / f"ck{i}"),
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, start_new_session=True)
                try:
                    out, err = proc.communicate(timeout=args.timeout)
                    code = str(proc.returncode)
                    if "terminate called" in out + err:
                        code += " (terminate called)"
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its workers
                    proc.communicate()
                    code = "hang (timeout)"
                codes[code] += 1
                print(f"launch {i + 1}: {code} in {time.monotonic() - t:.1f}s", flush=True)
    finally:
        busy.kill()
        busy.wait()
    ok = codes.get("0", 0)
    print(f"{args.script} script, {args.launcher}: {ok} of {args.launches} exited 0; "
          f"{dict(codes)}")


if __name__ == "__main__":
    main()
