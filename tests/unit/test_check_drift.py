"""SS209: an optimizer or LR scheduler stepped on some ranks only (the replicas drift)."""

from __future__ import annotations

import textwrap

from splitsync.check import check_source, select_rules

HEAD = ("import torch\nimport torch.distributed as dist\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "dist.init_process_group('gloo')\n")
LOOP = """
    model = DDP(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 10)
    for epoch in range(args.epochs):
        model(torch.randn(2, 4)).sum().backward()
        {step}
"""


def lines(source: str, head: str = HEAD) -> list[int]:
    found = check_source(head + textwrap.dedent(source), "case.py",
                         select_rules(["SS209"], gated=False))
    return [f.line for f in found]


def test_ss209_flags_a_scheduler_stepped_on_one_node_and_an_optimizer_on_rank_0() -> None:
    # SimCLR: `if args.nr == 0 and scheduler: scheduler.step()`, nr being the node's rank
    assert lines(LOOP.format(step="if args.nr == 0 and scheduler:\n            scheduler.step()")) \
        == [12]
    assert lines(LOOP.format(step="if dist.get_rank() == 0:\n            optimizer.step()")) == [12]
    assert lines(LOOP.format(step="if args.local_rank != 0:\n            pass\n        else:\n"
                                  "            scaler.step(optimizer)")) == [14]


def test_ss209_quiet_on_every_rank_or_in_one_process() -> None:
    assert lines(LOOP.format(step="optimizer.step()\n        scheduler.step()")) == []
    assert lines(LOOP.format(step="if epoch % 10 == 0:\n            scheduler.step()")) == []
    # logging under the rank test is fine; the step is outside it
    assert lines(LOOP.format(step="optimizer.step()\n        if args.nr == 0:\n"
                                  "            print(scheduler.get_last_lr())")) == []
    # no DDP model: one process, nothing to drift from
    assert lines(LOOP.format(step="if rank == 0:\n            optimizer.step()").replace(
        "DDP(torch.nn.Linear(4, 1))", "torch.nn.Linear(4, 1)"), head="import torch\n") == []
