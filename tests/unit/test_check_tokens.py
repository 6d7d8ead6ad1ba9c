"""SS610: a mean over each micro-batch's real tokens handed to backward without count=."""

from __future__ import annotations

import ast
import textwrap

import pytest

from splitsync.check import check_source, select_rules
from splitsync.check.facts import build_facts
from splitsync.check.project import with_project
from splitsync.check.rules.tokens import token_mean

SPLITSYNC = """import torch
import torch.nn.functional as F
import splitsync as ss
run = ss.init(accumulate=4)
model = run.model(net)
"""
DDP = """import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group()
model = DDP(net)
"""


def run(source: str, head: str = SPLITSYNC) -> list:
    return check_source(head + textwrap.dedent(source), "case.py",
                        select_rules(["SS610"], gated=False))


FLAGGED = {
    "masked division": """
        for x, y, mask in loader:
            per_token = F.cross_entropy(model(x), y, reduction="none")
            loss = (per_token * mask).sum() / mask.sum().clamp(min=1)
            run.backward(loss)
            run.step(opt)
    """,
    "ignore_index in a helper": """
        def lm_loss(model, batch):
            logits = model(batch["input_ids"])
            return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(),
                                   ignore_index=-100)

        for batch in loader:
            run.backward(lm_loss(model, batch) / 2)
            run.step(opt)
    """,
    "masked select mean": """
        for x, y in loader:
            per_token = F.cross_entropy(model(x), y, reduction="none")
            run.backward(per_token[y != 0].mean())
            run.step(opt)
    """,
    "hugging face LM": """
        from transformers import AutoModelForCausalLM
        net = AutoModelForCausalLM.from_config(config)
        for batch in loader:
            out = model(**batch)
            run.backward(out.loss)
            run.step(opt)
    """,
}


@pytest.mark.parametrize("case", sorted(FLAGGED))
def test_flags_a_token_mean_given_to_run_backward_without_count(case: str) -> None:
    found = run(FLAGGED[case])
    assert len(found) == 1, case
    f = found[0]
    assert f.severity == "warning" and f.code == "SS610"
    assert "`run.backward(" in f.message and "mean over the real items" in f.message
    assert "count=n" in f.fix and "docs/token-losses.md" in f.fix


def test_names_the_mean_and_its_line() -> None:
    found = run(FLAGGED["masked division"])
    assert "`(per_token * mask).sum() / mask.sum().clamp(min=1)` (line 9)" in found[0].message
    assert found[0].line == 10


def test_flags_plain_ddp_with_an_ignore_index_criterion() -> None:
    found = run("""
        criterion = nn.CrossEntropyLoss(ignore_index=0)
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            opt.step()
    """, head=DDP)
    assert [f.line for f in found] == [12]
    assert "all-reduce the window's token count" in found[0].fix


def test_flags_hand_written_accumulation_in_one_process() -> None:
    found = run("""
        import torch.nn.functional as F
        for i, (x, y) in enumerate(loader):
            loss = F.cross_entropy(model(x), y, ignore_index=-100) / 4
            loss.backward()
            if (i + 1) % 4 == 0:
                opt.step()
    """, head="")
    assert len(found) == 1


@pytest.mark.parametrize("source", [
    # count= given: the step uses the mean over every token
    """
    for x, y, mask in loader:
        loss = (F.cross_entropy(model(x), y, reduction="none") * mask).sum() / mask.sum()
        run.backward(loss, count=mask.sum())
        run.step(opt)
    """,
    # a mean over samples, not over masked tokens
    """
    for x, y in loader:
        run.backward(F.cross_entropy(model(x), y))
        run.step(opt)
    """,
    # a sum: nothing to weigh
    """
    for x, y in loader:
        run.backward(F.cross_entropy(model(x), y, ignore_index=-100, reduction="sum"))
        run.step(opt)
    """,
])
def test_quiet_when_weighed_or_not_a_token_mean(source: str) -> None:
    assert run(source) == []


def test_quiet_for_one_process_without_accumulation() -> None:
    assert run("""
        import torch.nn.functional as F
        for x, y in loader:
            loss = F.cross_entropy(model(x), y, ignore_index=-100)
            loss.backward()
            opt.step()
    """, head="") == []


def test_a_loss_built_over_many_names_walks_its_scope_once() -> None:
    """The tracer follows each name to its assignments; a loss summed from many terms (each
    assigned from others) once walked the whole scope per name read, which made SS610 a
    fifth of the checker's time on long training functions. Same finding, one walk."""
    terms = "".join(f"        t{i} = x[{i}] * 2\n" for i in range(1, 40))
    total = " + ".join(f"t{i}" for i in range(40))
    source = DDP + textwrap.dedent("""
        def train(loader, opt):
            for x, y in loader:
                t0 = F.cross_entropy(model(x), y, ignore_index=-100)
        """) + terms + f"        loss = {total}\n        loss.backward()\n        opt.step()\n"
    facts = with_project(build_facts(ast.parse(source), "case.py", source))
    walks = []
    real = facts.tree_index.walk_scope

    def counted(scope: ast.AST):  # type: ignore[no-untyped-def]
        walks.append(scope)
        return real(scope)

    object.__setattr__(facts.tree_index, "walk_scope", counted)
    found = list(token_mean(facts))
    assert len(found) == 1 and isinstance(found[0][1], ast.Call)
    assert len(walks) == 1
