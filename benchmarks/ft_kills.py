"""Two replica groups (of 1 and of 2 processes, gloo, DDP), group 1 SIGKILLed in the middle
of a step every k of its own committed steps, for several k: what the issue's acceptance asks.

For every run: the survivors' pids (never restarted), the survivors' committed steps over
attempted beside the schedule's ceiling (each mid-step kill necessarily spoils one survivor
step), whether every recovered incarnation's weights equal the survivors' at its first
committed step and at the end, and ``splitsync audit``'s verdict (every sample once).

  PYTHONPATH=src python benchmarks/ft_kills.py --out /tmp/ft_kills
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "launcher"))
sys.path.insert(0, str(ROOT / "src"))

from ftkit import SCRIPT, summary  # noqa: E402


def one(out: Path, nproc: int, every: int, kills: int, samples: int) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    began = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "splitsync", "run", "--replica-groups", "2", "-n", str(nproc),
         "--max-restarts", str(kills + 1), str(SCRIPT), str(out), "--kill-mid",
         "--kill-every", str(every), "--kills", str(kills), "--samples", str(samples),
         "--slow", "0.3", "--save-every", "100"],
        env=env, capture_output=True, text=True, timeout=1500)
    audit = subprocess.run([sys.executable, "-m", "splitsync", "audit", str(out), "--json"],
                           env=env, capture_output=True, text=True, timeout=300)
    s = summary(out)
    rep = json.loads(audit.stdout) if audit.stdout.strip().startswith("{") else {}
    survivors = {k: v for k, v in s["pids"].items() if k[0] == 0}
    spoiled = s["survivor_attempted"] - s["survivor_committed"]
    done_kills = len(s["pids"].get((1, 0), [])) - 1  # group 1's incarnations that trained
    attempted = s["survivor_attempted"]
    ceiling = (attempted - done_kills) / attempted if attempted else 0.0
    efficiency = s["survivor_committed"] / attempted if attempted else 0.0
    finals = {d["hash"] for d in s["done"].values() if d is not None}
    return {"groups": f"2x{nproc}", "k": every, "rc": proc.returncode,
            "seconds": round(time.time() - began, 1), "kills": done_kills,
            "survivors_kept_pids": all(len(v) == 1 for v in survivors.values()),
            "attempted": attempted, "committed": s["survivor_committed"],
            "spoiled": spoiled, "efficiency": round(efficiency, 4),
            "ceiling": round(ceiling, 4), "rejoins": len(s["rejoins"]),
            "rejoins_equal": not s["mismatched_steps"], "final_equal": len(finals) == 1,
            "audit_ok": audit.returncode == 0,
            "epochs": [e["status"] for e in rep.get("epochs", [])]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="/tmp/ft_kills")
    p.add_argument("--ks", default="50,100,200")
    p.add_argument("--kills", type=int, default=3)
    p.add_argument("--nprocs", default="1,2")
    a = p.parse_args()
    rows = []
    for nproc in (int(x) for x in a.nprocs.split(",")):
        for k in (int(x) for x in a.ks.split(",")):
            samples = 4000 * nproc + 3  # 1001 group-batches of 4 a process: padded at the end
            r = one(Path(a.out) / f"n{nproc}-k{k}", nproc, k, a.kills, samples)
            rows.append(r)
            print(json.dumps(r), flush=True)
    print("\n| groups | k | kills | survivors kept pids | committed / attempted | ceiling | "
          "rejoins equal | final equal | audit |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['groups']} | {r['k']} | {r['kills']} | {r['survivors_kept_pids']} | "
              f"{r['committed']}/{r['attempted']} = {100 * r['efficiency']:.2f}% | "
              f"{100 * r['ceiling']:.2f}% | {r['rejoins_equal']} ({r['rejoins']}) | "
              f"{r['final_equal']} | {'once' if r['audit_ok'] else 'FAILED'} |")


if __name__ == "__main__":
    main()
