"""Evaluation over a padding DistributedSampler (SS304).

``DistributedSampler`` gives every rank the same number of samples: when the data set's
length is not a multiple of the world size it repeats the first samples to fill the last
shard. Training does not mind; an evaluation does: the repeated images are counted twice in
the accuracy, and a sum over the padded shards divided by ``len(dataset)`` is not a mean
(Lightning's ``train_fabric.py`` example: 359 test images, 360 evaluated; Accelerate issue
226: 10,167 samples counted for a 10,000-image test set).

Found three ways: a ``DistributedSampler`` built for a validation or test set without
``drop_last=True``; a loader factory known to shard with a padding sampler called for one
(ignite's ``idist.auto_dataloader``, timm's ``create_loader(..., distributed=...)``); and a
sum accumulated over a sharded loader divided by the data set's length.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from splitsync.check.facts import Facts, dotted, last_name
from splitsync.check.loaders import accumulated, is_eval, iterated, sharded_loaders
from splitsync.check.model import Hit, Rule

__all__ = ["RULES"]

_EVAL = re.compile(r"val|test|eval", re.I)
_DATASET = re.compile(r"dataset|data_set|^ds$|set$", re.I)
_SAMPLERS = frozenset({"DistributedSampler"})
#: Loader factories that shard with a padding DistributedSampler when distributed.
_PADDING_FACTORIES = frozenset({"auto_dataloader", "create_loader"})
_FIX = ("evaluate without padding: gather the per-sample results and keep the first "
        "`len(dataset)` (`accelerator.gather_for_metrics`, `run.gather`), or shard with a "
        "sampler that does not repeat samples and all-reduce the sums and the counts; or "
        "evaluate the whole set on rank 0")


def _named_eval(facts: Facts, call: ast.Call) -> str | None:
    """The evaluation data set (or loader) ``call`` is built for, by its name."""
    holder = facts.parents.get(call)
    targets = [dotted(t) or "" for t in getattr(holder, "targets", [])]
    if isinstance(holder, ast.keyword):  # DataLoader(val_set, sampler=DistributedSampler(...))
        loader = facts.parents.get(holder)
        targets = [dotted(t) or "" for t in getattr(facts.parents.get(loader), "targets", [])]
    names = [dotted(call.args[0]) or "" if call.args else "", *targets]
    return next((n for n in names if n and _EVAL.search(n.rsplit(".", 1)[-1])), None)


def _trimmed(facts: Facts) -> bool:
    """Does the file cut gathered results back to the data set's length (``[:len(ds)]``)?"""
    return any(isinstance(n.upper, ast.Call) and last_name(n.upper) == "len"  # type: ignore[attr-defined]
               for n in facts.of(ast.Slice))


def _samplers(facts: Facts) -> Iterator[Hit]:
    for call in facts.named_calls(*_SAMPLERS, *_PADDING_FACTORIES):
        name = last_name(call) or ""
        full = facts.resolve(call.func) or ""
        if name in _SAMPLERS:
            if any(k.arg == "drop_last" for k in call.keywords):
                continue  # drops the remainder instead (evaluated elsewhere, or not at all)
        elif name in _PADDING_FACTORIES:
            if name == "create_loader" and not any(k.arg == "distributed" for k in call.keywords):
                continue
            if name == "auto_dataloader" and not full.startswith("ignite"):
                continue
        else:
            continue
        what = _named_eval(facts, call)
        if what is None:
            continue
        how = ("pads each shard to the same length" if name in _SAMPLERS else
               "shards it with a DistributedSampler, which pads each shard to the same length")
        yield Hit(call, f"`{facts.text(call, 90)}` is built for `{what}`, an evaluation set, "
                  f"and {how} by repeating samples when the set's length is not a multiple of "
                  "the world size: the repeated samples are counted twice in the metric, which "
                  "then changes with the number of processes.", f"{_FIX}.")


def _evaluates(facts: Facts, loop: ast.AST, fn: ast.FunctionDef) -> bool:
    """Is ``loop`` an evaluation: under ``no_grad``/``inference_mode``, or in a function
    named for testing or validation (not one that also trains)?"""
    if any(isinstance(p, ast.With) and any(last_name(i.context_expr) in {
            "no_grad", "inference_mode"} for i in p.items) for p in facts.ancestors(loop)):
        return True
    return bool(_EVAL.search(fn.name)) and is_eval(facts, loop, fn)


def _divided_by_length(facts: Facts) -> Iterator[Hit]:
    """``loss_sum / len(loader.dataset)`` after a loop over a sharded loader."""
    if not any(isinstance(n.op, ast.Div) and isinstance(n.right, ast.Call)  # type: ignore[attr-defined]
               and last_name(n.right) == "len" for n in facts.of(ast.BinOp)):  # type: ignore[attr-defined]
        return  # no division by a length: nothing to read the loaders for
    loaders = sharded_loaders(facts)
    if not loaders:
        return
    for loop in facts.of(ast.For, ast.AsyncFor):
        name = iterated(loop.iter)  # type: ignore[attr-defined]
        scope = facts.scope(loop)
        if name not in loaders or not isinstance(scope, ast.FunctionDef) \
                or not _evaluates(facts, loop, scope):
            continue
        sums = accumulated(loop)  # type: ignore[arg-type]
        for node in facts.inside(scope, ast.BinOp):
            if node.lineno <= loop.end_lineno or not isinstance(node.op, ast.Div):  # type: ignore[attr-defined,operator]
                continue
            right = node.right  # type: ignore[attr-defined]
            if not (isinstance(right, ast.Call) and last_name(right) == "len" and right.args
                    and _DATASET.search(last_name(right.args[0]) or "")):
                continue  # `/ len(loader)` is this rank's number of batches, no padding
            if not any(isinstance(n, ast.Name) and n.id in sums
                       for n in ast.walk(node.left)):  # type: ignore[attr-defined]
                continue
            yield Hit(node, f"`{facts.text(node, 80)}` divides a sum over `{name}`, whose "
                      "shards a DistributedSampler pads to the same length, by the data set's "
                      f"length `{facts.text(right, 40)}`: the padded duplicates are in the sum "
                      "but not in the length, so the mean is off (and any count over the same "
                      "loop counts them too).", f"{_FIX}.")


def padded_evaluation(facts: Facts) -> Iterator[Hit]:
    """SS304: an evaluation over shards a DistributedSampler pads with repeated samples."""
    if not facts.in_distributed_run or _trimmed(facts):
        return
    yield from _samplers(facts)
    yield from _divided_by_length(facts)


RULES = (
    Rule("SS304", "padded-evaluation", "warning",
         "an evaluation over a DistributedSampler that pads with repeated samples",
         "DistributedSampler makes every shard the same length by repeating samples when the "
         "data set's length is not a multiple of the world size. Used for validation or test "
         "data (a sampler, or ignite's `idist.auto_dataloader` / timm's `create_loader(..., "
         "distributed=...)`, built for a set named val/test/eval, without `drop_last=True`), "
         "the duplicates are counted in the metric; a sum over such shards divided by "
         "`len(dataset)` is not a mean. Fix by gathering per-sample results and trimming to "
         "the set's length (`accelerator.gather_for_metrics`), or by a sampler that does not "
         "pad plus reduced sums and counts. Known false positives: data sets whose length "
         "the world size always divides, and code that trims the duplicates in a module the "
         "checker does not read.", padded_evaluation),
)
