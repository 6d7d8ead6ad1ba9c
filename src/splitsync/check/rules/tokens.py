"""A loss averaged over each micro-batch's real tokens, handed to backward where micro-batches
are averaged again (SS610).

``F.cross_entropy(..., ignore_index=pad)``, ``(loss * mask).sum() / mask.sum()``,
``loss[mask].mean()`` and a Hugging Face language model's ``outputs.loss`` are means over the
items of one micro-batch. Under gradient accumulation or data parallelism those means are
averaged again, one per micro-batch and rank, whatever their item counts: a micro-batch of 3
real tokens weighs as much as one of 300, and the step differs from one process on the
global batch (docs/token-losses.md). ``run.backward(loss, count=n)`` weighs each by its items.

Evidence required: the loss given to ``run.backward`` (without ``count=``) or to ``.backward()``
in a script that trains data-parallel or accumulates, is such a mean, directly or through
the names and local functions it is computed from.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from splitsync.check.facts import Facts, dotted, last_name
from splitsync.check.flow import conditional_between, loops_of
from splitsync.check.model import Hit, Rule

__all__ = ["RULES", "token_mean_without_count", "token_mean"]

_CE = ("cross_entropy", "nll_loss", "CrossEntropyLoss", "NLLLoss")
#: Hugging Face heads whose ``.loss`` is a mean over the labels that are not -100.
_LM_HEADS = re.compile(r"(ForCausalLM|LMHeadModel|ForMaskedLM|ForSeq2SeqLM|"
                       r"ForConditionalGeneration|ForTokenClassification)\b")
_DEPTH = 4


def _sum_of(expr: ast.AST) -> ast.AST | None:
    """``x`` of ``x.sum()`` / ``torch.sum(x)`` (through ``.clamp(...)``, ``+ eps``, ...)."""
    for node in ast.walk(expr):
        if isinstance(node, ast.Call) and last_name(node) in ("sum", "count_nonzero"):
            if isinstance(node.func, ast.Attribute) and not node.args and \
                    dotted(node.func.value) not in ("torch", "np", "numpy"):
                return node.func.value
            if node.args:
                return node.args[0]
    return None


def _masked_division(facts: Facts, node: ast.BinOp) -> bool:
    """``(l * mask).sum() / mask.sum()``: the denominator sums what weighs the numerator."""
    if not isinstance(node.op, ast.Div):
        return False
    den = _sum_of(node.right)
    if den is None or isinstance(den, ast.Constant):
        return False
    mask = ast.unparse(den)
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult) and mask in (
        ast.unparse(n.left), ast.unparse(n.right)) for n in ast.walk(node.left))


def _masked_mean(node: ast.Call) -> bool:
    """``loss[mask].mean()`` / ``loss.masked_select(mask).mean()``."""
    if last_name(node) != "mean" or not isinstance(node.func, ast.Attribute):
        return False
    inner = node.func.value
    if isinstance(inner, ast.Subscript):
        index = ast.unparse(inner.slice)
        return "mask" in index.lower() or isinstance(inner.slice, ast.Compare)
    return isinstance(inner, ast.Call) and last_name(inner) == "masked_select"


def _ignore_index(facts: Facts, node: ast.Call) -> bool:
    if not facts.is_torch(node, *_CE):
        return False
    words = {k.arg: k.value for k in node.keywords}
    reduction = words.get("reduction")
    if isinstance(reduction, ast.Constant) and reduction.value in ("sum", "none"):
        return False
    return "ignore_index" in words


def _lm_loss(facts: Facts, node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "loss"
            and bool(_LM_HEADS.search(facts.source)))


class _Tracer:
    """Where the value of an expression comes from, within its scope and local functions."""

    def __init__(self, facts: Facts) -> None:
        self.facts = facts
        self.criteria = self._criteria()
        # Both caches are exact: an answer depends only on its arguments and the file. A
        # name read many times (a loss built over many lines) was a walk of its scope each.
        self._found: dict[tuple[ast.AST, ast.AST, int, int], ast.AST | None] = {}
        self._assigned: dict[ast.AST, dict[str, list[tuple[int, ast.AST]]]] = {}

    def _criteria(self) -> set[str]:
        """Names bound to ``nn.CrossEntropyLoss(ignore_index=...)``."""
        out = set()
        for node in self.facts.of(ast.Assign):
            value = node.value  # type: ignore[attr-defined]
            if isinstance(value, ast.Call) and _ignore_index(self.facts, value):
                out.update(t for t in (dotted(x) for x in node.targets) if t)  # type: ignore[attr-defined]
        return out

    def find(self, expr: ast.AST, scope: ast.AST, before: int, depth: int = 0) -> ast.AST | None:
        """The node that makes ``expr`` a mean over a micro-batch's items, if any."""
        if depth > _DEPTH:
            return None
        key = (expr, scope, before, depth)
        if key not in self._found:
            self._found[key] = self._find(expr, scope, before, depth)
        return self._found[key]

    def _find(self, expr: ast.AST, scope: ast.AST, before: int, depth: int) -> ast.AST | None:
        facts = self.facts
        for node in ast.walk(expr):
            if isinstance(node, ast.BinOp) and _masked_division(facts, node):
                return node
            if isinstance(node, ast.Call) and (
                    _ignore_index(facts, node) or _masked_mean(node)
                    or dotted(node.func) in self.criteria):
                return node
            if _lm_loss(facts, node):
                return node
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id in facts.functions:
                fn = facts.functions[node.func.id]
                for ret in facts.inside(fn, ast.Return):
                    if ret.value is not None:  # type: ignore[attr-defined]
                        found = self.find(ret.value, fn, ret.lineno, depth + 1)  # type: ignore[attr-defined]
                        if found is not None:
                            return found
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                found = self._from_name(node.id, scope, before, depth)
                if found is not None:
                    return found
        return None

    def _from_name(self, name: str, scope: ast.AST, before: int, depth: int) -> ast.AST | None:
        for lineno, value in self._assignments(scope).get(name, ()):
            if lineno >= before:
                continue
            found = self.find(value, scope, lineno, depth + 1)
            if found is not None:
                return found
        return None

    def _assignments(self, scope: ast.AST) -> dict[str, list[tuple[int, ast.AST]]]:
        """(line, value) of each assignment to a plain name in ``scope``, by name, in source
        order: one walk of the scope for all the names read in it."""
        if scope in self._assigned:
            return self._assigned[scope]
        out: dict[str, list[tuple[int, ast.AST]]] = {}
        for node in self.facts.walk_scope(scope):
            if isinstance(node, ast.Assign):
                names = dict.fromkeys(t.id for t in node.targets if isinstance(t, ast.Name))
                value = node.value
            elif isinstance(node, ast.AugAssign | ast.AnnAssign) and isinstance(
                    node.target, ast.Name) and node.value is not None:
                names, value = {node.target.id: None}, node.value
            else:
                continue
            for target in names:
                out.setdefault(target, []).append((node.lineno, value))
        self._assigned[scope] = out
        return out


def _accumulates(facts: Facts, back: ast.Call) -> bool:
    """The step is conditional inside the backward's loop (a hand-written accumulation)."""
    loop = next(loops_of(facts, back), None)
    return loop is not None and any(
        next(loops_of(facts, s), None) is loop and conditional_between(facts, s, loop)
        for s in facts.method_calls("step"))


def token_mean(facts: Facts) -> Iterator[tuple[ast.Call, ast.AST, bool]]:
    """(backward call, the mean it is given, is it run.backward) for each backward whose
    loss is a mean over a micro-batch's items, in a script where micro-batches are averaged."""
    tracer = _Tracer(facts)
    for back in facts.method_calls("backward"):
        receiver = back.func.value  # type: ignore[attr-defined]
        on_run = facts.is_run(receiver)
        if on_run:
            if not back.args or any(k.arg == "count" for k in back.keywords):
                continue
            loss = back.args[0]
        else:
            if not (facts.in_distributed_run or _accumulates(facts, back)):
                continue
            loss = receiver
        found = tracer.find(loss, facts.scope(back), back.lineno)
        if found is not None:
            yield back, found, on_run


def _fixed_blocks(facts: Facts) -> bool:
    """Is the text cut into blocks of one length and batched without padding (Hugging Face's
    ``group_texts`` into ``block_size`` chunks, ``default_data_collator``)? Then every
    micro-batch holds the same number of labelled tokens and a mean of means is the mean."""
    names = facts.loaded_names
    return "block_size" in names and "default_data_collator" in names and (
        "group_texts" in facts.functions or "group_texts" in names)


def token_mean_without_count(facts: Facts) -> Iterator[Hit]:
    """SS610: a per-micro-batch mean over items given to backward without ``count=``."""
    blocks = _fixed_blocks(facts)
    for back, mean, on_run in token_mean(facts):
        if blocks and isinstance(mean, ast.Attribute) and mean.attr == "loss":
            continue  # a language model's loss over equal blocks: every micro-batch weighs alike
        what = facts.text(mean, 60)
        where = f"`{what}` (line {mean.lineno})"  # type: ignore[attr-defined]
        if on_run:
            loss = facts.text(back.args[0], 40)
            fix = (f"pass the number of items the loss is the mean of: `run.backward({loss}, "
                   "count=n)`, e.g. `n = (labels != -100).sum()` or `mask.sum()` of this "
                   "micro-batch; the step then uses the mean over every item of all "
                   "micro-batches and ranks (docs/token-losses.md).")
        else:
            fix = ("weigh micro-batches by their items: sum the per-token losses, all-reduce "
                   "the window's token count and divide by it before the step; or port to "
                   "splitsync and write `run.backward(loss, count=n)`.")
        yield Hit(back, f"`{facts.text(back, 50)}` gets {where}, a mean over the real items "
                  "(tokens) of one micro-batch. Under accumulation or data parallelism these "
                  "means are averaged again with equal weights, so a micro-batch of 3 real "
                  "tokens counts as much as one of 300: when micro-batches hold different "
                  "numbers of real tokens, the step differs from one process on the whole "
                  "batch.", fix)


RULES = (
    Rule("SS610", "token-mean-without-count", "warning",
         "a masked or ignore_index mean handed to backward under accumulation or DDP",
         "A loss averaged over each micro-batch's real tokens (cross_entropy with "
         "ignore_index, (loss * mask).sum() / mask.sum(), loss[mask].mean(), a Hugging Face "
         "language model's outputs.loss) is averaged again across micro-batches and ranks "
         "with equal weights: the mean of means, not the mean over all tokens. "
         "run.backward(loss, count=n) weighs each micro-batch by its n items. Known false "
         "positives: micro-batches that always hold the same number of items (packed "
         "sequences without padding), where the two means agree.",
         token_mean_without_count),
)
