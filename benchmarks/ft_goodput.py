"""The same failure schedule run both ways: restart-based DDP and fault tolerant (torchft),
with their goodput side by side, and ``splitsync plan --failures`` against both.

Both jobs train the same model on the same data with 2 processes: ``splitsync run -n 2
--max-restarts K`` (a failure restarts both workers, which resume from the last checkpoint)
and ``splitsync run --replica-groups 2 -n 1 --max-restarts K`` (a failure restarts the
failed group, which recovers live from the other). A controller SIGKILLs one worker (rank 1,
or group 1's) every ``--every`` seconds of wall time after training began. Goodput is read
from the runs' own clocks (``splitsync goodput``); the plan is given the costs measured in
the same runs (checkpoint stall, restart, step, quorum, recovery) and the failure period,
and its prediction is compared with the measured goodput.

  PYTHONPATH=src python benchmarks/ft_goodput.py --every 25 --samples 8000 --out /tmp/ftgp
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCRIPT = ROOT / "tests" / "launcher" / "ft_script.py"
sys.path.insert(0, str(ROOT / "src"))

from splitsync.tools.goodput.report import goodput, read_incarnations  # noqa: E402
from splitsync.tools.plan.failures import FailureInputs, ft_goodput, restart_goodput  # noqa: E402


def _victim(out: Path, plain: bool) -> int | None:
    """The pid of the newest process of rank 1 (plain) or of group 1 (fault tolerant)."""
    name = "steps-g0-r1.jsonl" if plain else "steps-g1-r0.jsonl"
    path = out / name
    if not path.exists():
        return None
    pid = None
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("ev") == "step":
            pid = rec["pid"]
    return pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def run_job(out: Path, plain: bool, a: argparse.Namespace) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    launch = (["run", "-n", "2"] if plain else ["run", "--replica-groups", "2", "-n", "1"])
    cmd = [sys.executable, "-m", "splitsync", *launch, "--max-restarts", str(a.restarts),
           str(SCRIPT), str(out), "--samples", str(a.samples), "--sleep", str(a.sleep),
           "--save-every", str(a.save_every), "--slow", "0"]
    if plain:
        cmd.append("--plain")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    began = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                            stderr=open(out / "launcher.log", "w"))  # noqa: SIM115
    kills, first = [], None
    while proc.poll() is None:
        time.sleep(0.05)
        if first is None and (out / "steps-g0-r0.jsonl").exists():
            first = time.time()
        if first is None:
            continue
        # periodic in wall time: each failure `every` seconds after the one before (a kill
        # that finds the victim still starting waits for its first step); the first half a
        # period in, the mean phase of failures that do not know when the job began
        due = first + a.every / 2 if not kills else began + kills[-1] + a.every
        if time.time() >= due and len(kills) < a.restarts:
            pid = _victim(out, plain)
            if pid is not None and _alive(pid):
                os.kill(pid, signal.SIGKILL)
                kills.append(time.time() - began)
    return {"rc": proc.returncode, "kills": kills, "seconds": time.time() - began}


def _period(job: dict, every: float) -> float:
    """The failure period the job saw: ``every``, or longer when a kill had to wait for the
    victim's first step."""
    k = job["kills"]
    return max(every, (k[-1] - k[0]) / (len(k) - 1)) if len(k) > 1 else every


def measured_costs(out: Path, plain: bool) -> dict:
    incs = read_incarnations(out)
    rep = goodput(out)
    rows = [r for i in incs for r in i.rows]
    gaps = [b[0] - a[0] for i in incs for a, b in zip(i.rows, i.rows[1:], strict=False)
            if b[2] and b[0] - a[0] < 1.0]
    step = statistics.median(gaps) if gaps else 0.1
    saves = [b - a for i in incs for a, b in i.saves]
    first = [i for i in incs if i.restart_count == 0 and i.resume_at is not None]
    startup = statistics.mean(i.resume_at - i.started for i in first) if first else 0.0
    restarts = max(1, rep.restarts)
    restart = (rep.parts["down"] + rep.parts["startup"] - startup * rep.timelines) / restarts
    quorum = statistics.median(r[3] for r in rows) if rows else 0.0
    heals = [r[4] for r in rows if r[4] > 0]
    return {"step": step, "save": statistics.mean(saves) if saves else 0.0,
            "startup": startup, "restart": restart, "quorum": quorum,
            "heal": statistics.mean(heals) if heals else 0.2,
            "productive": rep.parts["productive"] / rep.timelines, "report": rep}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--every", type=float, default=25.0, help="seconds between failures")
    p.add_argument("--samples", type=int, default=8000)
    p.add_argument("--sleep", type=float, default=0.05, help="compute per step, seconds")
    p.add_argument("--save-every", type=int, default=50)
    p.add_argument("--restarts", type=int, default=4)
    p.add_argument("--out", default="/tmp/ft_goodput")
    a = p.parse_args()
    root = Path(a.out)
    results = {}
    for plain in (True, False):
        name = "restart" if plain else "torchft"
        out = root / name
        job = run_job(out, plain, a)
        costs = measured_costs(out, plain)
        rep = costs.pop("report")
        inputs = FailureInputs(
            nodes=2, mtbf=2 * _period(job, a.every), save=costs["save"],
            restart=costs["restart"],
            step=costs["step"], groups=2, heartbeat=1.0, heal=costs["heal"],
            rejoin=costs["restart"], quorum=costs["quorum"], startup=costs["startup"],
            work=costs["productive"], pattern="periodic")
        interval = a.save_every * costs["step"]
        plan = restart_goodput(inputs, interval) if plain else ft_goodput(inputs, interval)
        results[name] = {"job": job, "measured": round(rep.goodput, 4),
                         "predicted": round(plan.job_goodput, 4),
                         "error": round(plan.job_goodput / rep.goodput - 1, 4),
                         "parts": {k: round(v, 2) for k, v in rep.parts.items()},
                         "wall": round(rep.wall, 2), "steps": rep.steps,
                         "costs": {k: round(v, 4) for k, v in costs.items()}}
        print(json.dumps({name: results[name]}), flush=True)
    print("\n| run | kills | wall s | goodput measured | plan --failures | error |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {len(r['job']['kills'])} | {r['wall']} | {100 * r['measured']:.1f}% | "
              f"{100 * r['predicted']:.1f}% | {100 * r['error']:+.1f}% |")


if __name__ == "__main__":
    main()
