"""SS601 host sync per step, SS602 accumulation without no_sync, SS603 BatchNorm under DDP."""

from __future__ import annotations

import textwrap

from splitsync.check import check_source, select_rules

HEAD = """import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group()
model = DDP(net)
"""


def run(code: str, source: str, head: str = HEAD) -> list:
    return check_source(head + textwrap.dedent(source), "case.py", select_rules([code], gated=False))


def test_ss601_flags_item_every_step() -> None:
    found = run("SS601", """
        for x, y in loader:
            loss = model(x).sum()
            loss.backward()
            opt.step()
            total += loss.item()
            preds.append(model(x).cpu())
    """)
    assert [f.line for f in found] == [12, 13] and found[0].severity == "info"
    assert "`loss.item()` runs on every training step (the loop at line 8)" in found[0].message
    assert "`total += loss.detach()`" in found[0].fix


def test_ss601_accepts_periodic_and_per_epoch_reads() -> None:
    assert run("SS601", """
        for epoch in range(3):
            for step, (x, y) in enumerate(loader):
                loss = model(x).sum()
                loss.backward()
                if step % 100 == 0:
                    print(loss.item())
            print(total.item())
        for x in val_loader:
            acc = model(x).argmax().item()
    """) == []


def test_ss602_flags_modulo_accumulation_without_no_sync() -> None:
    found = run("SS602", """
        for i, (x, y) in enumerate(loader):
            loss = model(x).sum() / 4
            loss.backward()
            if (i + 1) % 4 == 0:
                optimizer.step()
                optimizer.zero_grad()
    """)
    assert len(found) == 1 and found[0].line == 10
    assert "only when `(i + 1) % 4 == 0` (line 12)" in found[0].message
    assert "`with model.no_sync():`" in found[0].fix and "accumulate=N" in found[0].fix


def test_ss602_flags_micro_step_loop_accumulation() -> None:
    found = run("SS602", """
        for batch in loader:
            for micro in batch.chunk(4):
                model(micro).sum().backward()
            optimizer.step()
    """)
    assert len(found) == 1 and "micro-step loop at line 9" in found[0].message


def test_ss602_accepts_no_sync_plain_steps_and_run_backward() -> None:
    assert run("SS602", """
        for i, x in enumerate(loader):
            ctx = model.no_sync() if (i + 1) % 4 else contextlib.nullcontext()
            with ctx:
                model(x).sum().backward()
            if (i + 1) % 4 == 0:
                optimizer.step()
    """) == []
    assert run("SS602", """
        for x in loader:
            model(x).sum().backward()
            optimizer.step()
    """) == []
    assert run("SS602", """
        import splitsync
        run = splitsync.init(accumulate=4)
        model = run.model(net)
        for i, x in enumerate(loader):
            run.backward(model(x).sum())
            if (i + 1) % 4 == 0:
                run.step(opt)
    """, head="") == []


def test_ss603_flags_batchnorm_in_ddp_model() -> None:
    found = run("SS603", """
        net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.BatchNorm2d(8))
    """)
    assert len(found) == 1 and found[0].severity == "info"  # advice: depends on the batch size
    assert "(and 1 more)" in found[0].message and "small" in found[0].message
    assert "convert_sync_batchnorm" in found[0].fix


def test_ss603_accepts_sync_batchnorm_or_no_ddp() -> None:
    assert run("SS603", """
        net = nn.Sequential(nn.BatchNorm2d(8))
        net = nn.SyncBatchNorm.convert_sync_batchnorm(net)
    """) == []
    assert run("SS603", "net = nn.Sequential(nn.BatchNorm2d(8))\n", head="from torch import nn\n") == []
    found = run("SS603", """
        import splitsync
        from torch import nn
        run = splitsync.init()
        model = run.model(nn.Sequential(nn.BatchNorm1d(4)))
    """, head="")
    assert len(found) == 1 and "sync_batchnorm=True" in found[0].fix
    assert run("SS603", """
        import splitsync
        from torch import nn
        run = splitsync.init()
        model = run.model(nn.Sequential(nn.BatchNorm1d(4)), sync_batchnorm=True)
    """, head="") == []


def test_ss601_silent_in_a_one_process_script() -> None:
    assert run("SS601", """
        for x, y in loader:
            loss = model(x).sum()
            loss.backward()
            losses.append(loss.item())
    """, head="import torch\n") == []
