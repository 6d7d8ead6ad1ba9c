"""Process-group set-up that goes wrong before training starts: a timeout given as days
(SS212), a SLURM branch that reads the rank but never the world size (SS213), and DDP on a
path where the process group is never initialised (SS214)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from splitsync.check.facts import Facts, dotted
from splitsync.check.flow import ends_in_exit
from splitsync.check.model import Hit, Rule

__all__ = ["RULES"]

#: A timedelta's first positional argument is days: anything this long was meant as seconds.
_DAYS = 30
_SECONDS_WORDS = re.compile(r"sec|timeout", re.I)
_SLURM_RANK = re.compile(r"SLURM_PROCID|OMPI_COMM_WORLD_RANK|PMI_RANK")
_WORLD = re.compile(r"SLURM_NTASKS|SLURM_NPROCS|WORLD_SIZE|world_size|OMPI_COMM_WORLD_SIZE|"
                    r"PMI_SIZE|SLURM_JOB_NUM_NODES|SLURM_NNODES|nnodes|ngpus_per_node", re.I)
_DIST_TEST = re.compile(r"distributed|is_initialized|is_dist|world_size|num_tasks|ddp|"
                        r"num_gpus|n_gpu|is_available|local_rank|rank", re.I)
_WRAPS = ("DistributedDataParallel", "FullyShardedDataParallel")


def _timeout_context(facts: Facts, call: ast.Call) -> str | None:
    """Where the timedelta goes: ``timeout=`` of a call, or a name that says timeout."""
    parent = facts.parents.get(call)
    if isinstance(parent, ast.keyword) and parent.arg and "timeout" in parent.arg.lower():
        return f"`{parent.arg}=`"
    if isinstance(parent, ast.Assign):
        names = [dotted(t) or "" for t in parent.targets]
        if any("timeout" in n.lower() for n in names):
            return f"`{names[0]}`"
    return None


def timeout_in_days(facts: Facts) -> Iterator[Hit]:
    """SS212: ``timedelta(4800)`` (days) as a process-group timeout meant in seconds."""
    for call in facts.named_calls("timedelta"):
        if len(call.args) != 1:
            continue  # `timedelta(0, 3600)` names its seconds
        arg = call.args[0]
        days = arg.value if isinstance(arg, ast.Constant) and isinstance(
            arg.value, int | float) and not isinstance(arg.value, bool) else None
        seconds_name = days is None and bool(_SECONDS_WORDS.search(dotted(arg) or ""))
        if not ((days is not None and days >= _DAYS) or seconds_name):
            continue
        where = _timeout_context(facts, call)
        if where is None:
            continue  # date arithmetic, not a timeout
        amount = f"{days:,} days" if days is not None else f"`{facts.text(arg, 30)}` days"
        yield Hit(call, f"`{facts.text(call, 50)}` is {amount} ({where}): a timedelta's first "
                  "positional argument is days, not seconds, so a rank that hangs is waited for "
                  "practically forever instead of failing with an error.",
                  f"name the unit: `timedelta(seconds={facts.text(arg, 30)})` (or "
                  "`minutes=`).")


def slurm_world_size(facts: Facts) -> Iterator[Hit]:
    """SS213: a branch for SLURM (or MPI) that takes the rank from the scheduler but leaves
    the world size at its default, while ``init_process_group`` is given ``world_size=``."""
    inits = facts.torch_calls("init_process_group")
    if not any(k.arg == "world_size" for i in inits for k in i.keywords):
        return  # env:// reads WORLD_SIZE itself
    if re.search(r"SLURM_NTASKS|SLURM_NPROCS|OMPI_COMM_WORLD_SIZE|PMI_SIZE", facts.source):
        return  # the world size is read from the scheduler somewhere
    for node in facts.of(ast.If):
        test = facts.text(node.test, 300)  # type: ignore[attr-defined]
        body = "\n".join(ast.unparse(s) for s in node.body)  # type: ignore[attr-defined]
        if "SLURM" not in test and "OMPI" not in test and "PMI" not in test:
            continue
        if not _SLURM_RANK.search(body) or _WORLD.search(body):
            continue
        yield Hit(node, f"the branch `if {facts.text(node.test, 60)}:` takes the rank from the "
                  "scheduler but never its world size, and `init_process_group` is given "
                  "`world_size=` from the defaults: rank 0 starts a group of the default size "
                  "(often 1) and trains alone, and the other ranks fail to join it.",
                  "read the world size in the same branch: `world_size = "
                  "int(os.environ['SLURM_NTASKS'])` (and the GPU from `SLURM_LOCALID`), or "
                  "launch with torchrun and use `init_process_group()` with env://.")


def _test_of(facts: Facts, node: ast.AST, scope: ast.AST) -> list[ast.If]:
    return [p for p in facts.ancestors(node) if isinstance(p, ast.If)
            and facts.scope(p) is scope]


def ddp_without_group_on_a_path(facts: Facts) -> Iterator[Hit]:
    """SS214: ``if args.distributed: init_process_group(...)`` and then ``DDP(model)``
    unconditionally: on the path where the test is false DDP finds no process group."""
    inits = facts.torch_calls("init_process_group") + facts.init_calls()
    for wrap in facts.torch_calls(*_WRAPS):
        scope = facts.scope(wrap)
        mine = [i for i in inits if facts.scope(i) is scope and i.lineno < wrap.lineno]
        if not mine:
            continue
        tests = [_test_of(facts, i, scope) for i in mine]
        if any(not t for t in tests):
            continue  # initialised on every path
        guard = tests[0][0]
        both = any(any(x is i for x in ast.walk(s)) for s in guard.orelse for i in inits)
        same = facts.text(guard.test, 300)
        if both or ends_in_exit(guard.orelse) or any(
                _DIST_TEST.search(facts.text(p.test, 300)) or facts.text(p.test, 300) == same
                for p in _test_of(facts, wrap, scope)):
            continue  # the other path initialises too, leaves, or the wrap is guarded itself
        yield Hit(wrap, f"`{facts.text(wrap, 60)}` runs on every path, but the process group is "
                  f"initialised only where `{facts.text(guard.test, 60)}` (line {guard.lineno}): "
                  "on the other path DDP raises \"Default process group has not been "
                  "initialized\".",
                  f"wrap under the same test (`if {facts.text(guard.test, 40)}: model = "
                  "DDP(model)`), or initialise on every path (a one-process gloo group at world "
                  "size 1); `run.model(model)` in splitsync does both.")


RULES = (
    Rule("SS212", "timeout-in-days", "warning",
         "a process-group timeout written `timedelta(4800)`: 4,800 days, not seconds",
         "timedelta's first positional argument is days. Handed to `init_process_group("
         "timeout=...)` (or any `timeout=`, or a name that says timeout), `timedelta(4800)` "
         "means a collective that hangs is waited on for 13 years instead of failing. Reported "
         "for 30 days or more, or a days argument whose name says seconds. Known false "
         "positives: a timeout meant to be that long.", timeout_in_days),
    Rule("SS213", "slurm-world-size-missing", "error",
         "a SLURM/MPI branch that sets the rank from the scheduler but not the world size",
         "`if 'SLURM_PROCID' in os.environ: rank = int(os.environ['SLURM_PROCID'])` with "
         "`init_process_group(..., world_size=args.world_size)` and no SLURM_NTASKS read: the "
         "world size stays at its default, so rank 0 forms a group of one and trains alone "
         "while rank 1 crashes or waits. Known false positives: a world size exported as "
         "WORLD_SIZE by the batch script and read under another name.", slurm_world_size),
    Rule("SS214", "ddp-without-group-on-a-path", "error",
         "DDP/FSDP wrapped on every path but the process group initialised on some paths only",
         "`if args.distributed: dist.init_process_group(...)` followed by an unconditional "
         "`model = DDP(model)`: the non-distributed path (a laptop, a one-GPU debug run) "
         "crashes with \"Default process group has not been initialized\". Known false "
         "positives: the other path is unreachable for reasons the checker cannot see.",
         ddp_without_group_on_a_path),
)
