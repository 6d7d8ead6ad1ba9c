"""Reading what ``ft_script.py`` wrote: per group, its processes and steps; checks shared by
the fault-tolerance tests and ``benchmarks/ft_*.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).with_name("ft_script.py")


def read_steps(out: Path) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """(group, rank) -> its JSON lines, in order (every incarnation)."""
    rows: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for f in sorted(out.glob("steps-g*-r*.jsonl")):
        g, r = f.stem.split("-")[1:]
        rows[(int(g[1:]), int(r[1:]))] = [json.loads(x) for x in f.read_text().splitlines()
                                           if x.strip()]
    return rows


def summary(out: Path) -> dict[str, Any]:
    """Pids, kills, hashes and the committed-step efficiency of a run."""
    rows = read_steps(out)
    pids = {key: sorted({r["pid"] for r in rs}) for key, rs in rows.items()}
    hashes: dict[int, set[str]] = {}
    for rs in rows.values():
        for r in rs:
            if r["ev"] == "step" and r["committed"]:
                hashes.setdefault(r["step"], set()).add(r["hash"])
    done = {key: next((r for r in rs if r["ev"] == "done"), None) for key, rs in rows.items()}
    survivor = [r for r in rows[(0, 0)] if r["ev"] == "step"]
    committed = sum(r["committed"] for r in survivor)
    # a recovered incarnation's first committed step: its hash must be the survivors'
    rejoins = []
    for (g, _), rs in rows.items():
        starts = [i for i, r in enumerate(rs) if r["ev"] == "start"]
        for i in starts[1:]:
            first = next((r for r in rs[i:] if r["ev"] == "step" and r["committed"]), None)
            if first is not None:
                rejoins.append((g, first["step"], first["hash"], first["P"]))
    return {"pids": pids, "mismatched_steps": sorted(s for s, h in hashes.items() if len(h) > 1),
            "done": done, "survivor_attempted": len(survivor), "survivor_committed": committed,
            "rejoins": rejoins, "hashes": hashes}
