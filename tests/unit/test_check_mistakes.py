"""Mistakes found in public training code (issue 33), each in a fixture written from the real
script's idiom: the rule finds it on the line a user would change, and the same code with
the mistake corrected is quiet, so every case can fail."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from splitsync.check import check_file, check_source, select_rules
from splitsync.check.flow import nonmain_test, rank0_test
from splitsync.check.registry import all_rules

CASES = Path(__file__).parent / "check_cases" / "evidence" / "mistakes"
UNGATED = all_rules(gated=False)


def found(path: Path, code: str) -> list[tuple[int, str]]:
    return [(f.line, f.message) for f in check_file(path, UNGATED) if f.code == code]


def line_of(path: Path, where: str) -> int:
    return next(i for i, text in enumerate(path.read_text().splitlines(), 1) if where in text)


# (fixture, rule, text of the line it is reported on, the fix: old -> new text, or None)
MISTAKES = [
    ("one_gpu_no_device.py", "SS106", "DistributedDataParallel(model)",
     ("        model.cuda()\n", "        torch.cuda.set_device(0)\n        model.cuda()\n")),
    ("local_rank_flag.py", "SS106", 'add_argument("--local_rank"',
     ("default=0,", 'default=int(os.environ.get("LOCAL_RANK", 0)),')),
    ("mpi_load/train_util.py", "SS207", "dist_util.load_state_dict(resume_checkpoint)",
     ("            if dist.get_rank() == 0:\n", "            if True:\n")),
    ("eval_on_master.py", "SS207", "losses[k] = model(",
     ("        losses[k] = model(", "        losses[k] = model.module(")),
    ("master_returns.py", "SS207", "return -1",
     ("            return -1\n", "            raise SystemExit(1)\n")),
    ("nan_skip.py", "SS207", "if torch.isnan(loss):",
     ("        continue\n", "        loss = loss * 0\n")),
    ("optional_group/train_caption.py", "SS208", "dist.barrier()",
     ("        dist.barrier()", "        if args.distributed:\n            dist.barrier()")),
    ("swallowed_init.py", "SS208", "except Exception as e:",
     ("        logger.info(f\"distributed", "        raise\n        logger.info(f\"distributed")),
    ("dist_eval_sampler.py", "SS304", "sampler_val = torch.utils.data.DistributedSampler(",
     ("rank=global_rank, shuffle=False)", "rank=global_rank, shuffle=False, drop_last=True)")),
    ("fabric_padded_mean.py", "SS304", "/ len(test_loader.dataset)",
     ("/ len(test_loader.dataset)", "/ len(test_loader)")),
    ("fabric_val_loss.py", "SS506", "out = losses.mean()",
     ("    out = losses.mean()", "    out = fabric.all_reduce(losses.mean())")),
    ("print_force_world.py", "SS508", "force = force or (get_world_size() > 8)",
     ("        force = force or (get_world_size() > 8)\n", "")),
    ("print_local_rank.py", "SS508", "if local_rank == 0 or force:",
     ("if local_rank == 0 or force:", "if tdist.get_rank() == 0 or force:")),
    ("print_one_launch_path.py", "SS508", "if args.multiprocessing_distributed and args.gpu",
     ("args.multiprocessing_distributed and args.gpu != 0", "dist.get_rank() != 0")),
    ("run_folder.py", "SS509", "opt.save_dir = increment_path(", None),
    ("run_folder.py", "SS509", "os.mkdir(output_dir)",
     ("os.mkdir(output_dir)", "os.makedirs(output_dir, exist_ok=True)")),
    ("tqdm_every_rank.py", "SS501", "pbar = tqdm(",
     ("total=len(train_dataloader))", "total=len(train_dataloader), disable=dist.get_rank() != 0)")),
    ("wrapper_skipped_cpu.py", "SS205", "if dist.get_world_size() > 1:",
     ("            self.ddp_model = self.model\n", "            self.ddp_model = DDP(self.model)\n")),
]


@pytest.mark.parametrize(("name", "code", "where", "fix"), MISTAKES,
                         ids=[f"{m[0]}-{m[1]}-{i}" for i, m in enumerate(MISTAKES)])
def test_found_where_the_user_changes_it_and_quiet_once_fixed(
        name: str, code: str, where: str, fix: tuple[str, str] | None) -> None:
    path = CASES / name
    line = line_of(path, where)
    assert [at for at, _ in found(path, code)].count(line) == 1, found(path, code)
    if fix is None:
        return
    old, new = fix
    text = path.read_text()
    assert old in text, f"{name} no longer contains {old!r}"
    fixed = path.with_name(f"_fixed_{path.name}")
    try:
        fixed.write_text(text.replace(old, new))
        assert len(found(fixed, code)) == len(found(path, code)) - 1, found(fixed, code)
    finally:
        fixed.unlink()


def test_a_helper_that_broadcasts_is_collective_only_through_its_module() -> None:
    # `model.load_state_dict(...)` under rank 0 is no collective: only the helper of the
    # module whose function broadcasts (dist_util.load_state_dict) is
    source = ("import torch.distributed as dist\nimport torch\ndist.init_process_group()\n"
              "model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))\n"
              "if dist.get_rank() == 0:\n    model.module.load_state_dict(torch.load('x'))\n")
    assert check_source(source, "t.py", select_rules(["SS207"], gated=False)) == []


def test_the_rank_zero_first_barrier_pair_is_not_one_rank_only() -> None:
    # yolov5's torch_distributed_zero_first: the others wait first, rank 0 waits after
    source = ("import torch.distributed as dist\ndist.init_process_group()\n"
              "def zero_first(local_rank):\n"
              "    if local_rank not in [-1, 0]:\n        dist.barrier()\n"
              "    yield\n"
              "    if local_rank == 0:\n        dist.barrier()\n")
    assert check_source(source, "t.py", select_rules(["SS207"], gated=False)) == []


def test_a_barrier_right_after_the_group_is_created_is_not_group_missing(tmp_path: Path) -> None:
    # the set-up helper's own barrier runs on the path that has just created the group
    project = tmp_path / "p"
    project.mkdir()
    text = (CASES / "optional_group" / "utils.py").read_text()
    (project / "utils.py").write_text(text)
    assert [f for f in check_file(project / "utils.py", UNGATED) if f.code == "SS208"] == []


def test_only_a_broad_except_swallows_a_failed_rendezvous() -> None:
    # DLRM's materialize script: `except (KeyError, ValueError)` is "not launched": one process
    text = (CASES / "swallowed_init.py").read_text().replace(
        "except Exception as e:", "except (KeyError, ValueError) as e:")
    rules = select_rules(["SS208"], gated=False)
    assert check_source(text, "swallowed_init.py", rules) == []



@pytest.mark.parametrize("flag", ["is_rank0", "is_master", "args.is_main_process"])
def test_a_negated_rank_zero_flag_is_every_rank_but_zero(flag: str) -> None:
    # open_clip's evaluate(): `if not use_fsdp_eval and not is_rank0: return metrics` leaves
    # on every rank but 0; `not rank` (a rank number) stays rank 0's test
    negated = ast.parse(f"not {flag}", mode="eval").body
    assert not rank0_test(negated) and nonmain_test(negated)
    assert not rank0_test(ast.parse(f"not x and not {flag}", mode="eval").body)
    assert rank0_test(ast.parse("not rank", mode="eval").body)
