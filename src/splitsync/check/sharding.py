"""Is the data split between ranks: a sampler, a rank slice, a loader or dataset handed the
rank, or random batches drawn after seeding with the rank. Read per module by the engine
(the data helpers often live apart from the script) and by SS301 and the seed rules."""

from __future__ import annotations

import ast
import re

from splitsync.check.facts import SETUP_HELPER, Facts, last_name
from splitsync.check.flow import is_rank_like
from splitsync.check.ranks import rank_in

__all__ = ["sharded", "seeded_per_rank"]


_SHARDERS = frozenset({"DistributedSampler", "ShardSampler", "build_loader",
                       "split_dataset_by_node", "ElasticDistributedSampler",
                       "DistributedBatchSampler", "split_by_node", "islice"})



_SHARD_ARGS = ("rank", "shard", "num_replicas")



_DATA_WORDS = re.compile(r"data|loader|batch|sampler|shard|stream", re.I)



def _sharded(facts: Facts) -> bool:
    """Is the data split between ranks anywhere in the script?"""
    if not _SHARDERS.isdisjoint(facts.call_names()) or facts.run_calls("loader"):
        return True
    for node in facts.of(ast.Slice):  # manual shards: data[rank::world_size], Subset(..rank..)
        if rank_in(facts, node.lower) or rank_in(facts, node.step):  # type: ignore[attr-defined]
            return True
    if any(rank_in(facts, c) for c in facts.named_calls("Subset")):
        return True
    for call, full in facts.calls:  # a dataset told its rank shards itself: MyData(rank=rank)
        if not call.args and not call.keywords:
            continue  # nothing handed to it: it cannot be told the rank
        name = full.rsplit(".", 1)[-1] if full else (last_name(call) or "")
        if name[:1].isupper() and any(any(w in (k.arg or "") for w in _SHARD_ARGS)
                                      for k in call.keywords):
            return True
        # a loader or data helper handed the rank (`DistributedDataLoader(path, B, T, rank,
        # world)`, `make_imagenet1k(..., rank=rank)`) shards by rank itself
        if _DATA_WORDS.search(name) and not full.startswith("torch.") and any(
                is_rank_like(a) for a in (*call.args, *(k.value for k in call.keywords))):
            return True
        if not full.startswith("torch.") and not SETUP_HELPER.search(name) and any(
                k.arg in {"rank", "world_size", "num_replicas", "num_shards", "shard_id"}
                for k in call.keywords):
            return True  # `make_imagenet1k(..., world_size=ws, rank=rank)`
    # a loader class or data generator of the project that reads the rank itself
    # (modded-nanogpt's `DistributedDataLoader.__init__`: `self.rank = int(os.environ["RANK"])`)
    for node in facts.of(ast.ClassDef, ast.FunctionDef):
        if _DATA_WORDS.search(node.name) and _reads_rank(facts, node):  # type: ignore[attr-defined]
            return True
    return _seeded_per_rank(facts)



def _reads_rank(facts: Facts, node: ast.AST) -> bool:
    """Does ``node`` read the process's rank itself (``os.environ["RANK"]``,
    ``dist.get_rank()``), rather than take it as a parameter?"""
    return any(is_rank_like(n) for n in facts.inside(node, ast.Subscript)) or any(
        "rank" in (last_name(c) or "").lower() or is_rank_like(c)
        for c in facts.inside(node, ast.Call) if last_name(c) not in {"int", "str"})



def sharded(facts: Facts) -> bool:
    """Does this module split data between ranks (a sampler, a rank slice, a loader given
    the rank)? Read per module of a project: the data helpers often live apart."""
    return _sharded(facts)



def seeded_per_rank(facts: Facts) -> bool:
    """Is a seed set from the rank (``torch.manual_seed(seed + rank)``)?"""
    return _seeded_per_rank(facts)



def _seeded_per_rank(facts: Facts) -> bool:
    """Random batches drawn after seeding with the rank (nanoGPT's `seed + rank`): each rank
    samples its own data, which shards it as well as a sampler does."""
    derived: set[str] = set()
    for node in facts.of(ast.Assign):
        if rank_in(facts, node.value):  # type: ignore[attr-defined]
            derived.update(t.id for t in node.targets if isinstance(t, ast.Name))  # type: ignore[attr-defined]
    for call, _ in facts.calls:
        if "seed" not in (last_name(call) or "").lower():
            continue
        for n in (n for a in call.args for n in ast.walk(a)):
            if is_rank_like(n) or (isinstance(n, ast.Name) and n.id in derived):
                return True
    return False
