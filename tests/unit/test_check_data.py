"""SS301 unsharded data, SS302 set_epoch missing, SS401 no seed before the model."""

from __future__ import annotations

import textwrap

from splitsync.check import check_source, select_rules

DDP_HEAD = """
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
dist.init_process_group()
"""


def run(code: str, source: str, head: str = "") -> list:
    return check_source(head + textwrap.dedent(source), "case.py", select_rules([code], gated=False))


def test_ss301_flags_dataloader_without_sampler_in_ddp_script() -> None:
    found = run("SS301", """
        model = DDP(net)
        loader = DataLoader(dataset, batch_size=32, shuffle=True)
        for x, y in loader:
            model(x).sum().backward()
    """, DDP_HEAD)
    assert len(found) == 1
    f = found[0]
    assert f.line == 9 and f.severity == "error"  # every rank trains on the same data
    assert "no `sampler=`" in f.message and "every rank" in f.message
    assert "DistributedSampler(dataset" in f.fix and "`shuffle=` moves to the sampler" in f.fix


def test_ss301_unseeded_random_input_is_per_rank_data() -> None:
    assert run("SS301", """
        model = DDP(net)
        for epoch in range(2):
            x = torch.randn(4, 10)
            model(x).sum().backward()
    """, DDP_HEAD) == []


def test_ss301_random_input_after_a_shared_seed_is_the_same_on_every_rank() -> None:
    found = run("SS301", """
        torch.manual_seed(0)
        model = DDP(net)
        for epoch in range(2):
            x = torch.randn(4, 10)
            model(x).sum().backward()
    """, DDP_HEAD)
    assert len(found) == 1 and found[0].severity == "warning" and "same random" in found[0].message


def test_ss301_flags_ddp_with_no_data_pipeline_at_the_training_loop() -> None:
    found = run("SS301", """
        model = DDP(net)
        for epoch in range(2):
            x = batches[epoch]
            model(x).sum().backward()
    """, DDP_HEAD)
    assert len(found) == 1 and found[0].line == 9 and "line 8" in found[0].message


def test_ss301_flags_plain_dataloader_in_splitsync_script() -> None:
    found = run("SS301", """
        import splitsync
        from torch.utils.data import DataLoader
        run = splitsync.init()
        model = run.model(net)
        for x in DataLoader(data, batch_size=8):
            model(x).sum().backward()
    """)
    assert len(found) == 1 and "run.loader(...)" in found[0].fix


def test_ss301_accepts_samplers_run_loader_and_manual_shards() -> None:
    assert run("SS301", """
        model = DDP(net)
        loader = DataLoader(dataset, batch_size=32, sampler=DistributedSampler(dataset))
        val = DataLoader(val_set, batch_size=32)  # evaluated on rank 0 only
    """, DDP_HEAD) == []
    assert run("SS301", """
        model = DDP(net)
        shard = data[dist.get_rank()::dist.get_world_size()]
    """, DDP_HEAD) == []
    assert run("SS301", """
        import splitsync
        run = splitsync.init()
        model = run.model(net)
        loader = run.loader(DataLoader(data, batch_size=8, shuffle=True))
    """) == []
    assert run("SS301", """
        loader = DataLoader(dataset, batch_size=32)  # not a data-parallel script
        for x in loader:
            model(x).sum().backward()
    """) == []


def test_ss302_flags_sampler_whose_epoch_never_changes() -> None:
    found = run("SS302", """
        sampler = DistributedSampler(dataset)
        loader = DataLoader(dataset, sampler=sampler)
        for epoch in range(3):
            for x in loader:
                pass
    """, DDP_HEAD)
    assert len(found) == 1 and found[0].severity == "warning"
    assert "`set_epoch` is never called" in found[0].message
    assert "`sampler.set_epoch(epoch)`" in found[0].fix


def test_ss302_flags_set_epoch_called_once_outside_the_loop() -> None:
    found = run("SS302", """
        sampler = DistributedSampler(dataset)
        sampler.set_epoch(0)
        for epoch in range(3):
            pass
    """, DDP_HEAD)
    assert len(found) == 1 and "outside the epoch loop (line 9)" in found[0].message


def test_ss302_accepts_set_epoch_in_loop_through_loader_or_unshuffled() -> None:
    assert run("SS302", """
        sampler = DistributedSampler(dataset)
        for epoch in range(3):
            sampler.set_epoch(epoch)
    """, DDP_HEAD) == []
    assert run("SS302", """
        loader = DataLoader(dataset, sampler=DistributedSampler(dataset))
        for epoch in range(3):
            loader.sampler.set_epoch(epoch)
    """, DDP_HEAD) == []
    assert run("SS302", """
        val_sampler = DistributedSampler(val_set, shuffle=False)
    """, DDP_HEAD) == []


def test_ss302_splitsync_loader_shuffled_without_run_epochs() -> None:
    source = """
        import splitsync
        run = splitsync.init()
        loader = run.loader(data, batch_size=8, shuffle=True)
        for epoch in {loop}:
            for x in loader:
                pass
    """
    found = run("SS302", source.format(loop="range(5)"))
    assert len(found) == 1 and "for epoch in run.epochs(5):" in found[0].fix
    assert run("SS302", source.format(loop="run.epochs(5)")) == []


def test_ss401_flags_model_built_before_any_seed() -> None:
    found = run("SS401", """
        def train():
            model = Net().to("cpu")
            ddp = DDP(model)
            torch.manual_seed(0)
    """, DDP_HEAD)
    assert len(found) == 1
    f = found[0]
    assert f.line == 9 and "`Net()`" in f.message and "in train()" in f.message
    assert "only afterwards (line 11)" in f.message
    assert "torch.manual_seed(SEED)" in f.fix and "splitsync.init(seed=SEED)" in f.fix


def test_ss401_flags_seed_in_main_block_when_children_are_spawned() -> None:
    found = run("SS401", """
        import torch.multiprocessing as mp
        def train(rank):
            model = DDP(Net())
        if __name__ == "__main__":
            torch.manual_seed(0)
            mp.spawn(train, nprocs=2)
    """, DDP_HEAD)
    assert len(found) == 1


def test_ss401_accepts_seed_before_model_helpers_and_splitsync() -> None:
    assert run("SS401", """
        def train():
            torch.manual_seed(0)
            model = DDP(Net())
    """, DDP_HEAD) == []
    assert run("SS401", """
        def set_seed(s):
            torch.manual_seed(s)
        def train():
            model = DDP(Net())
        set_seed(0)
    """, DDP_HEAD) == []
    assert run("SS401", """
        import splitsync
        run = splitsync.init()
        model = run.model(Net())
    """) == []


def test_ss401_flags_model_built_before_splitsync_init() -> None:
    found = run("SS401", """
        import splitsync
        def main():
            net = Net()
            with splitsync.init(seed=0) as run:
                model = run.model(net)
        main()
    """)
    assert len(found) == 1 and "splitsync.init seeds only afterwards (line 5)" in found[0].message
    assert "build the model after" in found[0].fix


def test_ss301_accepts_datasets_that_shard_themselves() -> None:
    assert run("SS301", """
        model = DDP(net)
        data = TokenStream(path, rank=dist.get_rank(), world_size=dist.get_world_size())
        for x in data:
            model(x).sum().backward()
    """, DDP_HEAD) == []
