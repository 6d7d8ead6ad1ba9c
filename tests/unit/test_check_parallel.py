"""SS201 DataParallel, SS202 DDP without a process group, SS203 training never run,
SS204 NCCL hard-coded: a positive and a negative case each."""

from __future__ import annotations

import textwrap

from splitsync.check import check_source, select_rules


def run(code: str, source: str) -> list:
    return check_source(textwrap.dedent(source), "case.py", select_rules([code], gated=False))


def test_ss201_flags_every_spelling_of_data_parallel() -> None:
    found = run("SS201", """
        import torch
        from torch import nn
        from torch.nn import DataParallel as DP
        a = torch.nn.DataParallel(net)
        b = nn.DataParallel(net)
        c = DP(net)
    """)
    assert [f.line for f in found] == [5, 6, 7]
    assert "GIL" in found[0].message and "DistributedDataParallel" in found[0].fix


def test_ss201_accepts_ddp_and_splitsync_dp_strategy() -> None:
    assert run("SS201", """
        import splitsync
        from torch.nn.parallel import DistributedDataParallel
        run = splitsync.init(strategy="dp")
        model = run.model(net)
        other = DistributedDataParallel(net)
        class DataParallelism:  # a name, not a call of torch's class
            pass
    """) == []


def test_ss202_flags_ddp_without_any_process_group() -> None:
    found = run("SS202", """
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(torch.nn.Linear(2, 2))
    """)
    assert len(found) == 1 and found[0].severity == "error"
    assert "init_process_group" in found[0].message
    assert "Default process group has not been initialized" in found[0].message


def test_ss202_flags_ddp_before_init_in_the_same_function() -> None:
    found = run("SS202", """
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        def main():
            model = DDP(net)
            dist.init_process_group("gloo")
        main()
    """)
    assert len(found) == 1 and "line 6" in found[0].message


def test_ss202_accepts_init_in_helper_or_splitsync() -> None:
    assert run("SS202", """
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        def setup(rank, world_size):
            dist.init_process_group("gloo", rank=rank, world_size=world_size)
        def train(rank, world_size):
            setup(rank, world_size)
            model = DDP(net)
    """) == []
    assert run("SS202", """
        from torch.nn.parallel import DistributedDataParallel as DDP
        from utils import init_distributed_mode
        init_distributed_mode(args)
        model = DDP(net)
    """) == []


def test_ss203_flags_train_that_main_never_calls() -> None:
    found = run("SS203", """
        import torch.distributed as dist
        def train(rank, world_size):
            dist.init_process_group("gloo", rank=rank, world_size=world_size)
            loss.backward()
        if __name__ == "__main__":
            print("use torchrun")
    """)
    assert len(found) == 1
    f = found[0]
    assert f.line == 3 and f.severity == "error"
    assert "`train(rank, world_size)`" in f.message and "line 6" in f.message
    assert "torch.multiprocessing.spawn(train, args=(world_size,)" in f.fix
    assert 'train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))' in f.fix


def test_ss203_accepts_called_spawned_and_library_functions() -> None:
    assert run("SS203", """
        import torch.multiprocessing as mp
        def train(rank, world_size):
            loss.backward()
        if __name__ == "__main__":
            mp.spawn(train, args=(2,), nprocs=2)
    """) == []
    assert run("SS203", """
        def train(model, loader):
            loss.backward()
        def main():
            train(model, loader)
        main()
    """) == []
    # a module of helpers (no module-level code) is not a script: nothing is expected to run
    assert run("SS203", """
        def train_one_epoch(model, loader):
            loss.backward()
    """) == []


def test_ss204_flags_nccl_literal_and_variable() -> None:
    found = run("SS204", """
        import torch.distributed as dist
        dist.init_process_group("nccl")
        dist.init_process_group(backend="NCCL")
        backend = "nccl"
        dist.init_process_group(backend=backend)
        dist.init_process_group(dist.Backend.NCCL)
    """)
    assert [f.line for f in found] == [3, 4, 6, 7]
    assert "first positional argument `backend`" in found[0].message
    assert "`backend=`" in found[1].message and "set at line 5" in found[2].message
    assert 'if torch.cuda.is_available() else "gloo"' in found[0].fix


def test_ss204_accepts_backend_chosen_from_hardware() -> None:
    assert run("SS204", """
        import torch
        import torch.distributed as dist
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        dist.init_process_group()
        dist.init_process_group("gloo")
        if torch.cuda.is_available():
            dist.init_process_group("nccl")
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
    """) == []


def test_ss202_and_ss301_skip_library_modules() -> None:
    library = """
        from torch.nn.parallel import DistributedDataParallel
        class Replicate:
            def wrap(self, module):
                self.ddp = DistributedDataParallel(module)
    """
    assert run("SS202", library) == [] and run("SS301", library) == []


def test_ss202_trusts_an_imported_setup_helper() -> None:
    assert run("SS202", """
        from torch.nn.parallel import DistributedDataParallel as DDP
        from utils import setup
        setup()
        model = DDP(net)
    """) == []
