"""Random preemption trials: a signal at a random moment of a 2-process `splitsync run`, then a
relaunch; every stop must save the last step taken and the relaunch must end bit-equal.

    python benchmarks/preempt_trials.py [--trials 100] [--out DIR] [--seed S] [--timeout 240]
        [--grace 20] [--work DIR]

Each trial picks a configuration (ddp or fsdp; accumulation 1 or 2; blocking or background
saves), a target (SIGTERM to `splitsync run` itself, or SIGTERM or SIGUSR1 to one worker)
and a moment (the first step, which is also the loader's start; inside a `run.save`; inside
an evaluation; a random step), runs tests/launcher/preempt_script.py until that moment,
sends the signal and waits for the launcher to exit. It records:

- hang: the launch did not end within --timeout (its process group is then killed);
- the exit code (75 for a stop, 0 when the run had finished before it could stop);
- the time from the signal to the launcher's exit;
- whether the newest checkpoint (`latest`) is at the last step the run printed;
- whether the relaunch, which resumes from it, ends with weights equal bit for bit to an
  uninterrupted run of the same configuration.

It prints one line per trial and a summary (p50/p99 of signal to exit), and writes
results.json (and each failed trial's output) under --out. ``--grace`` is the script's
``init(preempt_grace=...)`` (`splitsync run` waits ``--grace`` + 30 s before SIGKILL): on a
machine shared with other heavy jobs, a step can take seconds, and a stop that finds no
step boundary within the grace period exits with the previous checkpoint by design, which
these trials would count as a failure. ``--work`` keeps the uninterrupted runs there, and
reuses them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "launcher" / "preempt_script.py"
CONFIGS = [(s, k, bg) for s in ("ddp", "fsdp") for k in (1, 2) for bg in (False, True)]
TARGETS = ["agent:SIGTERM", "w0:SIGTERM", "w1:SIGTERM", "w0:SIGUSR1", "w1:SIGUSR1"]
MOMENTS = ["first-step", "save", "eval", "step"]
EPOCHS = 2


def command(ck: Path, out: Path, strategy: str, accumulate: int, background: bool,
            grace: float = 20.0) -> list[str]:
    return [sys.executable, "-m", "splitsync", "run", "-n", "2", "--shutdown-timeout",
            str(int(grace) + 30), str(SCRIPT), str(ck), str(out), "--strategy", strategy,
            "--accumulate", str(accumulate), "--epochs", str(EPOCHS), "--grace", str(grace),
            *(["--background"] if background else [])]


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "TORCHELASTIC",
                                "SLURM_", "OMPI_", "PMI_", "SPLITSYNC_"))}
    env["OMP_NUM_THREADS"] = "1"
    return env


@dataclass
class Launch:
    rc: int | None  # None: hung
    lines: list[str] = field(default_factory=list)
    sent_at: float | None = None
    ended_at: float = 0.0


def launch(cmd: list[str], timeout: float, trigger: str | None = None, delay: float = 0.0,
           target: str = "") -> Launch:
    """Run ``cmd``; on the line ``trigger`` (after ``delay`` s) send the target's signal."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=environment(), start_new_session=True)
    result = Launch(rc=None)
    pids: dict[int, int] = {}

    def fire() -> None:
        who, name = target.split(":")
        pid = proc.pid if who == "agent" else pids[int(who[1:])]
        result.sent_at = time.monotonic()
        try:
            os.kill(pid, getattr(signal, name))
        except ProcessLookupError:  # it had ended already
            result.sent_at = None

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            result.lines.append(line)
            m = re.match(r"pid (\d+) (\d+)", line)
            if m:
                pids[int(m.group(1))] = int(m.group(2))
            if trigger is not None and result.sent_at is None and line.strip() == trigger:
                if delay:
                    threading.Timer(delay, fire).start()
                    result.sent_at = -1.0  # armed
                else:
                    fire()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        result.rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    result.ended_at = time.monotonic()
    reader.join(timeout=5)
    return result


def printed_steps(lines: list[str]) -> list[int]:
    return [int(m.group(1)) for ln in lines if (m := re.fullmatch(r"step (\d+)", ln.strip()))]


def newest(ck: Path) -> int | None:
    try:
        return int((ck / "latest").read_text().strip().split("-")[1])
    except (OSError, IndexError, ValueError):
        return None


def same_weights(a: Path, b: Path) -> bool:
    import torch
    from safetensors.torch import load_file

    x, y = load_file(a), load_file(b)
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


@dataclass
class Trial:
    n: int
    strategy: str
    accumulate: int
    background: bool
    target: str
    moment: str
    trigger: str
    delay: float
    rc: int | None = None
    seconds: float | None = None  # signal -> exit of splitsync run
    last_step: int | None = None
    checkpoint: int | None = None
    at_last_step: bool = False
    relaunch_rc: int | None = None
    exact: bool = False
    hang: bool = False

    @property
    def ok(self) -> bool:
        return (not self.hang and self.rc in (0, 75) and self.at_last_step
                and self.relaunch_rc == 0 and self.exact)


def pick(rng: random.Random, n: int, steps: dict[tuple[str, int, bool], list[str]]) -> Trial:
    strategy, accumulate, background = rng.choice(CONFIGS)
    moment = rng.choice(MOMENTS)
    lines = [ln.strip() for ln in steps[(strategy, accumulate, background)]]
    delay = 0.0
    if moment == "first-step":
        trigger, delay = "resumed 0", rng.uniform(0.0, 0.3)
    elif moment == "save":
        trigger = rng.choice([ln for ln in lines if ln.startswith("save ")])
    elif moment == "eval":
        trigger, delay = "eval", rng.uniform(0.0, 0.25)
    else:
        trigger, delay = rng.choice([ln for ln in lines if ln.startswith("step ")]), \
            rng.uniform(0.0, 0.1)
    return Trial(n, strategy, accumulate, background, rng.choice(TARGETS), moment, trigger,
                 round(delay, 3))


def run_trial(t: Trial, root: Path, clean: Path, timeout: float,
              grace: float) -> tuple[Trial, str]:
    d = root / f"trial-{t.n:03d}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    ck, out = d / "ck", d / "out.safetensors"
    cmd = command(ck, out, t.strategy, t.accumulate, t.background, grace)
    first = launch(cmd, timeout, t.trigger, t.delay, t.target)
    t.hang = first.rc is None
    t.rc = first.rc
    if first.sent_at and first.sent_at > 0:
        t.seconds = round(first.ended_at - first.sent_at, 3)
    steps = printed_steps(first.lines)
    t.last_step = steps[-1] if steps else 0
    t.checkpoint = newest(ck)
    t.at_last_step = t.checkpoint == t.last_step or (t.checkpoint is None and t.last_step == 0)
    log = "".join(first.lines)
    if not t.hang:
        second = launch(cmd, timeout)
        t.relaunch_rc = second.rc
        t.hang = second.rc is None
        log += "\n--- relaunch ---\n" + "".join(second.lines)
        t.exact = second.rc == 0 and out.exists() and same_weights(out, clean)
    if t.ok:
        shutil.rmtree(d, ignore_errors=True)
    return t, log


def clean_runs(root: Path, timeout: float) -> tuple[dict, dict]:
    outs, lines = {}, {}
    for cfg in CONFIGS:
        d = root / f"clean-{cfg[0]}-{cfg[1]}-{int(cfg[2])}"
        if (d / "out.safetensors").exists() and (d / "lines.txt").exists():
            outs[cfg], lines[cfg] = d / "out.safetensors", (d / "lines.txt").read_text(
                ).splitlines(keepends=True)
            continue
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        got = launch(command(d / "ck", d / "out.safetensors", *cfg), timeout)
        if got.rc != 0:
            raise SystemExit(f"the uninterrupted run {cfg} failed:\n{''.join(got.lines)}")
        (d / "lines.txt").write_text("".join(got.lines))
        outs[cfg], lines[cfg] = d / "out.safetensors", got.lines
        print(f"uninterrupted {cfg}: {printed_steps(got.lines)[-1]} steps", flush=True)
    return outs, lines


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=100)
    p.add_argument("--out", default="splitsync-preempt-trials")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--timeout", type=float, default=240.0)
    p.add_argument("--grace", type=float, default=20.0)
    p.add_argument("--work", default=None, help="where the runs go (default: a new temp folder)")
    a = p.parse_args(argv)
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="preempt-trials-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"seed {seed}; grace {a.grace}s; work in {work}", flush=True)
    cleans, lines = clean_runs(work, a.timeout)
    trials: list[Trial] = []
    for n in range(a.trials):
        t = pick(rng, n, lines)
        t, log = run_trial(t, work, cleans[(t.strategy, t.accumulate, t.background)], a.timeout,
                           a.grace)
        trials.append(t)
        if not t.ok:
            (out / f"trial-{n:03d}.log").write_text(log)
        print(f"{n:3d} {t.strategy:4s} acc={t.accumulate} bg={int(t.background)} "
              f"{t.target:13s} {t.moment:10s} at {t.trigger!r}+{t.delay}s: rc={t.rc} "
              f"{t.seconds}s stop@{t.last_step} ckpt@{t.checkpoint} "
              f"relaunch={t.relaunch_rc} exact={t.exact} {'ok' if t.ok else 'FAILED'}",
              flush=True)
    times = [t.seconds for t in trials if t.seconds is not None and t.rc == 75]
    summary = {
        "seed": seed, "grace s": a.grace, "trials": len(trials), "hangs": sum(t.hang for t in trials),
        "stopped (75)": sum(t.rc == 75 for t in trials),
        "finished first (0)": sum(t.rc == 0 for t in trials),
        "newest checkpoint at the last step": sum(t.at_last_step for t in trials),
        "relaunch bit-equal": sum(t.exact for t in trials),
        "failed": sum(not t.ok for t in trials),
        "signal to exit p50 s": round(statistics.median(times), 2) if times else None,
        "signal to exit p99 s": round(percentile(times, 99), 2) if times else None,
        "signal to exit max s": round(max(times), 2) if times else None,
    }
    (out / "results.json").write_text(json.dumps(
        {"summary": summary, "trials": [asdict(t) for t in trials]}, indent=1))
    print("\n| " + " | ".join(summary) + " |\n|" + "---|" * len(summary))
    print("| " + " | ".join(str(v) for v in summary.values()) + " |")
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if summary["failed"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
