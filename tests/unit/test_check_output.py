"""SS501 print, SS502 torch.save, SS503 logging on every rank: positive and negative cases,
and the rank-0 guard forms the checker understands."""

from __future__ import annotations

import textwrap

import pytest

from splitsync.check import check_source, select_rules

HEAD = "import logging\nimport torch\nimport torch.distributed as dist\ndist.init_process_group()\n"


def run(code: str, source: str, head: str = HEAD) -> list:
    return check_source(head + textwrap.dedent(source), "case.py", select_rules([code], gated=False))


def test_ss501_flags_print_on_every_rank() -> None:
    found = run("SS501", """
        def train():
            print("epoch done")
        train()
    """)
    assert len(found) == 1 and found[0].line == 7
    assert "in train() runs on every rank" in found[0].message
    assert "`if rank == 0:`" in found[0].fix


def test_ss501_in_splitsync_script_suggests_run_print() -> None:
    found = run("SS501", """
        import splitsync
        run = splitsync.init()
        print("hello")
        run.print("hello")
        if run.is_main:
            print("once")
    """, head="")
    assert [f.line for f in found] == [4] and "run.print(...)" in found[0].fix


@pytest.mark.parametrize("guard", [
    "if rank == 0:", "if 0 == rank:", "if dist.get_rank() == 0:", "if args.local_rank in (-1, 0):",
    "if is_main:", "if master_process:", "if not rank:", "if run.is_main:",
    "if int(os.environ['RANK']) == 0:", "if world_size == 1 or rank == 0:",
    "if is_main_process():",
])
def test_ss501_accepts_rank0_guards(guard: str) -> None:
    assert run("SS501", f"""
        def train(rank):
            {guard}
                print("once")
    """) == []


def test_ss501_accepts_else_branch_early_exit_decorator_and_guarded_helper() -> None:
    assert run("SS501", """
        def a(rank):
            if rank != 0:
                pass
            else:
                print("once")
        def b(rank):
            if rank != 0:
                return
            print("once")
        @rank_zero_only
        def c():
            print("once")
        def report(msg):
            print(msg)
        def d(rank):
            if rank == 0:
                report("once")
        def e(rank):
            print(f"rank {rank}: my shard has 10 samples")  # names its rank: deliberate
    """) == []


SAMPLER = """
    from tqdm import tqdm
    class Diffusion:
        def loop(self, n):
            for t in tqdm(range(n), desc="sampling"):
                pass
        def fast_loop(self, n):
            print("fast sampling")
        def sample(self, n):
            fn = self.loop if n > 10 else self.fast_loop
            return fn(n)
    def train(model, rank):
        if rank == 0:
            model.sample(4)
        {unguarded}
    train(Diffusion(), dist.get_rank())
"""


def test_ss501_follows_a_method_chosen_into_a_variable() -> None:
    # lucidrains' trainers sample under `if accelerator.is_main_process:` through
    # `sample_fn = self.p_sample_loop if ... else self.ddim_sample`: one bar, not N
    assert run("SS501", SAMPLER.format(unguarded="pass")) == []
    found = run("SS501", SAMPLER.format(unguarded="model.sample(4)"))
    assert sorted(f.line for f in found) == [9, 12]


def test_ss501_silent_in_non_distributed_script_and_spawn_parent() -> None:
    assert run("SS501", "print('hi')\n", head="import torch\n") == []
    assert run("SS501", """
        import torch.multiprocessing as mp
        def train(rank):
            pass
        if __name__ == "__main__":
            print("spawning")
            mp.spawn(train, nprocs=2)
    """) == []


def test_ss502_flags_torch_save_on_every_rank() -> None:
    found = run("SS502", """
        torch.save(model.state_dict(), "ckpt.pt")
    """)
    assert len(found) == 1 and '`"ckpt.pt"`' in found[0].message
    assert "dist.barrier()" in found[0].fix


def test_ss502_accepts_guarded_or_per_rank_paths() -> None:
    assert run("SS502", """
        if dist.get_rank() == 0:
            torch.save(model.state_dict(), "ckpt.pt")
        torch.save(shard, f"shard_{rank}.pt")
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        torch.distributed.checkpoint.save(state, checkpoint_id="ckpt")
    """) == []


def test_ss503_flags_logging_info_on_every_rank() -> None:
    found = run("SS503", """
        logging.basicConfig(level=logging.INFO)
        logger = logging.getLogger(__name__)
        logger.info("step done")
        logging.info("step done")
    """)
    assert [f.line for f in found] == [8, 9]


def test_ss503_is_quiet_when_nothing_makes_info_records_visible() -> None:
    # no basicConfig, handler or level anywhere: the root logger (WARNING) drops INFO
    assert run("SS503", """
        logger = logging.getLogger(__name__)
        logger.info("step done")
    """) == []


def test_ss503_accepts_guarded_rank_tagged_and_run_logger() -> None:
    assert run("SS503", """
        logger = logging.getLogger(__name__)
        if rank == 0:
            logger.info("once")
        logger.info("rank %d ready", rank)
        logger.warning("every rank may warn")
        run.logger.info("rank-prefixed")
    """) == []


def test_output_rules_skip_library_modules() -> None:
    library = """
        import torch.distributed as dist
        def helper():
            print("a library may print; its caller decides which ranks call it")
            torch.save(obj, "x.pt")
    """
    assert run("SS501", library, head="import torch\n") == []
    assert run("SS502", library, head="import torch\n") == []


def test_ss501_accepts_imagenet_style_local_main_guard() -> None:
    assert run("SS501", """
        def main_worker(gpu, args):
            if not args.multiprocessing_distributed or args.rank % ngpus_per_node == 0:
                print("saving")
    """) == []


def test_ss501_a_helper_process_rank_0_starts_is_no_launcher() -> None:
    # open_clip's main() starts its remote-sync process under `if is_master(args):`: main is
    # a rank's own code, not the parent that launches the ranks, so its prints are per rank
    source = """
        import multiprocessing
        def main(args):
            print("=> using a layer from bitsandbytes")
            if dist.get_rank() == 0:
                proc = multiprocessing.Process(target=print)
                proc.start()
        main(None)
    """
    assert [f.line for f in run("SS501", source)] == [8]
    # the parent that starts the ranks prints once
    assert run("SS501", source.replace("if dist.get_rank() == 0:", "if True:")) == []


def test_a_value_made_on_rank_0_only_guards_like_a_rank_test() -> None:
    # `writer = None; if rank == 0: writer = SummaryWriter()`, then `if writer is not None:`
    source = """
        def train(rank):
            sync = None
            if rank == 0:
                sync = object()
            if sync is not None:
                logging.info("final sync")
                print("final sync")
            if sync is None:
                pass
            else:
                print("synced")
        train(dist.get_rank())
    """
    assert run("SS501", source) == [] and run("SS503", source) == []
    # made on every rank: the same tests guard nothing
    assert [f.line for f in run("SS501", source.replace("if rank == 0:", "if True:"))] == [12, 16]
