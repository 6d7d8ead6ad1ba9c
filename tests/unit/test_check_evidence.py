"""Evidence, not patterns: each fixture is written from a real script's idiom (named in its
docstring). The checker stays quiet where the code shows the finding does not hold, and the
same code with that evidence removed is reported, so every quiet case can fail."""

from __future__ import annotations

from pathlib import Path

import pytest

from splitsync.check import check_file, check_source, select_rules
from splitsync.check.registry import all_rules

CASES = Path(__file__).parent / "check_cases" / "evidence"
UNGATED = all_rules(gated=False)


def codes(path: Path) -> set[str]:
    return {f.code for f in check_file(path, UNGATED)}


def variant(name: str, code: str, old: str, new: str) -> set[str]:
    """Findings of ``code`` in the fixture with ``old`` replaced by ``new``, read alone."""
    text = (CASES / name).read_text()
    assert old in text, f"{name} no longer contains {old!r}"
    rules = [r for r in select_rules([code]) if r.code == code]
    return {f.code for f in check_source(text.replace(old, new), name, rules)}


# (fixture, rule kept quiet, evidence in the code, the same code without that evidence)
QUIET = [
    # output limited to rank 0 by configuration made elsewhere
    ("logger_nullhandler.py", "SS503", "if dist.get_rank() == 0:  # real logger",
     "if True:  # real logger"),
    ("per_rank_level.py", "SS503", "    if rank > 0:\n        logger.setLevel(logging.ERROR)\n",
     ""),
    # a guard whose value is true only on rank 0
    ("rank0_flag.py", "SS502", "if not self.can_checkpoint:", "if not self.model:"),
    # loaders that shard by rank themselves, and framework-managed loaders
    ("rank_loader.py", "SS301", "DistributedDataLoader(torch.arange(10_000), 4, 16, ddp_rank, "
     "ddp_world_size)", "DistributedDataLoader(torch.arange(10_000), 4, 16, 0, 1)"),
    ("prepared_loader.py", "SS301", "accelerator.prepare(optimizer, train_dataloader)",
     "accelerator.prepare(optimizer)"),
    # code reached only at world size 1
    ("single_process_branch.py", "SS501", "if args.distributed:", "if args.fast:"),
    ("single_process_branch.py", "SS502", "if args.distributed:", "if args.fast:"),
    ("single_process_branch.py", "SS501", "assert args.local_rank == -1,", "assert args.yaml_file,"),
    # CUDA behind backend == "nccl" or an is_available() early return
    ("cuda_behind_tests.py", "SS101", 'if backend == "nccl":', "if backend:"),
    ("cuda_behind_tests.py", "SS101", "    if not torch.cuda.is_available():\n        return None\n",
     ""),
    # .cuda() on modules without parameters or buffers
    ("paramless_cuda.py", "SS101", "nn.CrossEntropyLoss().cuda()", "nn.Linear(2, 2).cuda()"),
    # device defaults in function parameters that every call overrides
    ("overridden_default.py", "SS101", "training_loop(torch.nn.Linear(2, 2), device=device)",
     "training_loop(torch.nn.Linear(2, 2))"),
    # validation metrics summed over a sharded loader, then reduced across ranks
    ("reduced_val_metric.py", "SS506", "    top1.all_reduce()\n", ""),
]


@pytest.mark.parametrize(("name", "code", "old", "new"), QUIET,
                         ids=[f"{q[0]}-{q[1]}-{i}" for i, q in enumerate(QUIET)])
def test_quiet_where_the_code_shows_otherwise(name: str, code: str, old: str, new: str) -> None:
    assert code not in codes(CASES / name)
    assert code in variant(name, code, old, new)


def test_per_rank_log_level_set_in_a_helper_module_counts() -> None:
    # YOLO: `set_logging(rank)` lives in general.py; read alone, train.py's logs are flagged
    script = CASES / "yolo_logging" / "train.py"
    assert "SS503" not in codes(script)
    alone = check_source(script.read_text() + "\nlogging.basicConfig(level=logging.INFO)\n",
                         "train.py", select_rules(["SS503"]))
    assert {f.code for f in alone} == {"SS503"}


def test_process_group_created_by_a_launch_helper_in_another_module() -> None:
    script = CASES / "launch_helper" / "train_net.py"
    assert "SS202" not in codes(script)
    text = script.read_text().replace("launch(main, 2, args=(1,))", "main(1)")
    found = check_source(text, "train_net.py", select_rules(["SS202"]))
    assert [f.code for f in found] == ["SS202"]


def test_a_helper_named_alone_is_read_with_the_script_beside_it_that_imports_it() -> None:
    # engine.py's print is silenced by main.py's print override, even when engine.py is the
    # only file named; main.py's own findings are not reported for it
    helper = CASES / "helper_alone" / "engine.py"
    assert "SS501" not in codes(helper)
    assert {f.path for f in check_file(helper, UNGATED)} <= {str(helper)}
    project = CASES / "helper_alone"
    alone = check_source(helper.read_text(), "engine.py", select_rules(["SS501"]))
    assert alone == []  # alone it is not known to run distributed either
    text = (project / "main.py").read_text().replace("builtins.print = print", "pass")
    tmp = project.parent / "helper_alone_control"
    tmp.mkdir(exist_ok=True)
    try:
        (tmp / "engine.py").write_text(helper.read_text())
        (tmp / "main.py").write_text(text)
        assert "SS501" in {f.code for f in check_file(tmp / "engine.py", UNGATED)}
    finally:
        for f in tmp.glob("*.py"):
            f.unlink()
        tmp.rmdir()


# (fixture, the rule that must find the mistake, the line it is reported on)
MISTAKES = [
    ("seed_before_spawn.py", "SS401", "random.seed(args.seed)"),
    # reported at the caller's guard, the line to change, not at torch.save in the helper
    ("save_per_node_modulo.py", "SS504", "if not args.multiprocessing_distributed or"),
    # reported at the endless loop that walks the loader, not in the sampler's helper
    ("set_epoch_while_true.py", "SS302", "while True:"),
    ("backend_attribute.py", "SS204", 'args.dist_backend = "nccl"'),
    ("ema_before_ddp.py", "SS404", "model_ema = ModelEma(model"),
    ("fabric_print.py", "SS501", 'print(f"Number of trainable parameters'),
    ("fabric_print.py", "SS501", 'print(f"Saving adapter weights'),
    # reported on the branch that lacks the wrap
    ("unwrapped_cpu_path.py", "SS205", 'print("using CPU, this will be slow")'),
    ("device_ids_cpu.py", "SS206", "model = DDP(model, device_ids=[rank])"),
    ("copy_and_truncate.py", "SS505", "shutil.copytree("),
    ("no_sync_one_branch.py", "SS602", "scaler.scale(loss).backward()"),
    ("copy_and_truncate.py", "SS505", 'log = open(os.path.join(args.out_dir, "log.txt"), "w")'),
    ("unreduced_val_metric.py", "SS506", "return total_acc / len(val_loader)"),
]


@pytest.mark.parametrize(("name", "code", "where"), MISTAKES,
                         ids=[f"{m[0]}-{m[1]}-{i}" for i, m in enumerate(MISTAKES)])
def test_real_mistakes_are_found_where_they_are(name: str, code: str, where: str) -> None:
    path = CASES / "mistakes" / name
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if where in text)
    found = [f for f in check_file(path, UNGATED) if f.code == code]
    assert [f.line for f in found if f.line == line] == [line], [
        (f.line, f.message) for f in found]


def test_the_synchronising_last_micro_step_is_not_a_branch_without_no_sync() -> None:
    # modded-nanogpt: `if i < steps: with model.no_sync(): loss.backward()` / `else:
    # loss.backward()`; the unsynchronised-looking backward is the last micro-step
    source = (CASES / "mistakes" / "no_sync_one_branch.py").read_text()
    loop = source[source.index("        if args.fp16:"):source.index("        if last:")]
    fixed = source.replace(loop, (
        "        loss = (model(x) - y).pow(2).mean() / args.accum\n"
        "        if not last:\n"
        "            with model.no_sync():\n"
        "                loss.backward()\n"
        "        else:\n"
        "            loss.backward()\n"))
    rules = [r for r in UNGATED if r.code == "SS602"]
    assert check_source(fixed, "loop.py", rules) == []
    assert [f.code for f in check_source(source, "loop.py", rules)] == ["SS602"]


def test_a_validation_loader_without_a_distributed_sampler_is_not_a_shard() -> None:
    # every rank evaluating the whole set reports the model's accuracy: nothing to reduce
    source = (CASES / "mistakes" / "unreduced_val_metric.py").read_text()
    whole = source.replace("DataLoader(val_dataset, batch_size=args.batch_size, "
                           "sampler=val_sampler)", "DataLoader(val_dataset, batch_size=16)")
    assert whole != source
    assert check_source(whole, "main.py", select_rules(["SS506"])) == []
    # the same loop reduced through splitsync's collectives is quiet too
    reduced = source.replace("        return total_acc / len(val_loader)",
                             "        total_acc = run.sum(total_acc)\n"
                             "        return total_acc / len(val_loader)")
    assert check_source("import splitsync\nrun = splitsync.init()\n" + reduced, "main.py",
                        select_rules(["SS506"])) == []
