"""A shared checkpoint folder named from each rank's own clock or random draw (SS510):
``ckpt = f"run-{datetime.now():%H%M%S}"`` then ``accelerator.save_state(ckpt)`` on every
rank. The ranks read the clock at slightly different times: on either side of a second
boundary they name two folders, and one checkpoint is split across them."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from splitsync.check.facts import Facts, last_name
from splitsync.check.flow import guarded_by_rank0
from splitsync.check.model import Hit, Rule

__all__ = ["RULES"]

#: Calls that read this process's clock or draw at random.
_PER_PROCESS = frozenset({"now", "utcnow", "time", "time_ns", "strftime", "uuid1", "uuid4",
                          "token_hex", "randint", "random", "choice", "getrandbits",
                          "generate", "perf_counter"})
#: Saves every rank takes part in (each writes its shard, or they agree on the folder).
_JOINT_SAVES = frozenset({"save_state", "save_checkpoint", "save_state_dict", "async_save"})
_AGREE = frozenset({"broadcast_object_list", "broadcast", "bcast", "all_gather_object",
                    "gather_object"})


def _per_process_names(facts: Facts, scope: ast.AST) -> dict[str, ast.Call]:
    """Names in ``scope`` bound to a value read from this process's clock or random state
    (directly, or through a name bound so)."""
    found: dict[str, ast.Call] = {}
    for _ in range(2):
        for node in facts.inside(scope, ast.Assign):
            value = node.value  # type: ignore[attr-defined]
            source = next((c for c in facts.inside(value, ast.Call)
                           if last_name(c) in _PER_PROCESS), None)
            if source is None:
                source = next((found[n.id] for n in ast.walk(value)
                               if isinstance(n, ast.Name) and n.id in found), None)
            if source is None:
                continue
            for t in node.targets:  # type: ignore[attr-defined]
                if isinstance(t, ast.Name):
                    found.setdefault(t.id, source)
    return found


def clock_named_shared_path(facts: Facts) -> Iterator[Hit]:
    """SS510: a folder named from a per-process clock or random value, handed to a save
    every rank makes together, with no broadcast of the name."""
    if not facts.in_distributed_run:
        return
    agreed = {n.id for c in facts.named_calls(*_AGREE) for a in c.args
              for n in ast.walk(a) if isinstance(n, ast.Name)}
    for save in facts.named_calls(*_JOINT_SAVES):
        if guarded_by_rank0(facts, save):
            continue
        names = _per_process_names(facts, facts.scope(save))
        used = [n.id for a in (*save.args, *(k.value for k in save.keywords))
                for n in ast.walk(a) if isinstance(n, ast.Name) and n.id in names]
        if not used or used[0] in agreed:
            continue
        source = names[used[0]]
        yield Hit(save, f"`{facts.text(save, 60)}` is made by every rank into `{used[0]}`, named "
                  f"from `{facts.text(source, 40)}` (line {source.lineno}) read on each rank: "
                  "ranks that read it on either side of a second (or draw differently) name "
                  "different folders, and the checkpoint is split across them.",
                  "name the folder once: compute it on rank 0 and broadcast it "
                  "(`dist.broadcast_object_list([path], src=0)`), or derive it from the step "
                  "number, which every rank shares.")


RULES = (
    Rule("SS510", "per-rank-clock-path", "warning",
         "a checkpoint folder named from each rank's own clock or random draw before a save "
         "every rank makes",
         "Saves such as `accelerator.save_state(path)`, DeepSpeed's `save_checkpoint` or "
         "torch.distributed.checkpoint write one folder together. A `path` built from "
         "`datetime.now()`, `time.time()` or a random draw on each rank differs between "
         "ranks that cross a second boundary (or draw differently): the shards land in two "
         "folders and the checkpoint cannot be loaded. Known false positives: a name every "
         "rank agrees on through means the checker cannot see.", clock_named_shared_path),
)
