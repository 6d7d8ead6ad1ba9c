"""Idioms of real training code: the ones the checker used to get wrong (false alarms) and the
mistakes it used to miss. Each fixture is written for the test."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from splitsync.check import all_rules, check_file, check_paths, check_source, select_rules

PROJECTS = Path(__file__).parent / "check_cases" / "projects"
DIST = ("import os\nimport torch\nimport torch.distributed as dist\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "dist.init_process_group('gloo')\nrank = int(os.environ['RANK'])\n")


def run(code: str | None, source: str, head: str = DIST) -> list:
    rules = select_rules([code] if code else None, gated=False)
    return check_source(head + textwrap.dedent(source), "case.py", rules)


# --- following the project's imports -----------------------------------------------------

def test_print_override_in_an_imported_helper_silences_prints() -> None:
    found = check_file(PROJECTS / "mae_style" / "train.py")
    assert not [f for f in found if f.code == "SS501"]
    # read alone, the same script's print is flagged: the override is what changed it
    alone = check_source((PROJECTS / "mae_style" / "train.py").read_text(), "train.py",
                         select_rules(["SS501"]))
    assert [f.code for f in alone] == ["SS501"]


def test_set_epoch_in_a_helper_module_counts() -> None:
    found = check_file(PROJECTS / "mae_style" / "train.py")
    assert "SS302" not in {f.code for f in found}
    alone = check_source((PROJECTS / "mae_style" / "train.py").read_text(), "train.py",
                         select_rules(["SS302"]))
    assert [f.code for f in alone] == ["SS302"]


def test_process_group_created_in_an_imported_helper_is_not_an_error() -> None:
    found = check_file(PROJECTS / "mae_style" / "train.py")
    assert [f for f in found if f.severity == "error"] == []


def test_accumulation_through_a_helper_under_ddp_is_found_in_the_helper_module() -> None:
    found, files = check_paths([PROJECTS / "mae_style"])
    hits = [f for f in found if f.code == "SS602"]
    assert files == 4 and len(hits) == 1
    assert hits[0].path.endswith("engine.py") and "no_sync" in hits[0].fix


def test_checking_a_script_reports_its_imported_modules_too() -> None:
    found, files = check_paths([PROJECTS / "synthetic" / "train.py"])
    assert files == 2
    assert {(Path(f.path).name, f.code) for f in found} >= {
        ("data.py", "SS402"), ("train.py", "SS303"), ("train.py", "SS504")}


def test_seeded_generator_dataset_is_not_flagged() -> None:
    found, _ = check_paths([PROJECTS / "synthetic"])
    ss402 = [f for f in found if f.code == "SS402"]
    assert len(ss402) == 1 and ss402[0].line == 8  # NoiseSet, not SeededNoiseSet


# --- false alarms that must stay quiet ------------------------------------------------------

def test_batch_encoding_move_in_place_is_not_an_error() -> None:
    assert run("SS103", """
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained("x")
        batch = tok(["a b"], return_tensors="pt")
        batch.to("cpu")
        for step, batch in enumerate(DataLoader(ds, collate_fn=tok.pad)):
            batch.to("cpu")
    """, "from torch.utils.data import DataLoader\n") == []


def test_tensor_move_discarded_is_an_error_only_for_known_tensors() -> None:
    found = run("SS103", """
        x = torch.randn(3)
        x.to("cpu")
        loader = DataLoader(ds)
        for inputs, labels in loader:
            inputs.to("cpu")
    """, "import torch\nfrom torch.utils.data import DataLoader\n")
    assert [(f.line, f.severity) for f in found] == [(5, "error"), (8, "warning")]


def test_ddp_with_device_ids_moves_its_inputs() -> None:
    assert run("SS102", """
        model = torch.nn.Linear(10, 5).to(rank)
        ddp_model = DDP(model, device_ids=[rank])
        out = ddp_model(torch.randn(20, 10))
        other = DDP(model, [rank])
        out = other(torch.randn(20, 10))
    """) == []


def test_print_naming_the_rank_or_a_value_derived_from_it_is_deliberate() -> None:
    assert run("SS501", """
        def setup():
            local = int(os.environ["LOCAL_RANK"])
            device: torch.device = torch.device(f"cpu:{local}")
            print(f"running on {device}")
            print(f"[{os.getpid()}] started")
            print("rank", rank, "ready")
    """) == []


def test_configurator_device_default_is_one_info() -> None:
    found = run(None, """
        device = 'cuda'
        compile = True
        exec(open('configurator.py').read())
        device_type = 'cuda' if 'cuda' in device else 'cpu'
    """, "import torch\n")
    assert [(f.code, f.severity) for f in found] == [("SS101", "info")]
    assert "overridable default" in found[0].message


def test_argparse_cuda_default_is_one_info() -> None:
    found = run("SS101", """
        import argparse
        p = argparse.ArgumentParser()
        p.add_argument("--device", default="cuda", help="device")
    """, "")
    assert [(f.code, f.severity) for f in found] == [("SS101", "info")]


# --- mistakes that must be found ------------------------------------------------------------

@pytest.mark.parametrize("line", ["torch.accelerator.device_index(rank)",
                                  "torch.cuda.device(rank)", "torch.no_grad()",
                                  "model.no_sync()"])
def test_context_manager_as_a_statement_is_an_error(line: str) -> None:
    found = run("SS105", f"""
        model = DDP(torch.nn.Linear(2, 2))
        {line}
    """)
    assert len(found) == 1 and found[0].severity == "error" and "with" in found[0].fix


def test_context_managers_used_properly_and_setters_are_fine() -> None:
    assert run("SS105", """
        torch.accelerator.set_device_index(rank)
        torch.cuda.set_device(rank)
        torch.set_grad_enabled(False)
        with torch.no_grad():
            pass
    """) == []


def test_random_split_without_a_seeded_generator() -> None:
    found = run("SS303", """
        from torch.utils.data import random_split
        a, b = random_split(ds, [8, 2])
        c, d = random_split(ds, [8, 2], generator=torch.Generator().manual_seed(0))
    """)
    assert [f.line for f in found] == [9]
    seeded = run("SS303", """
        from torch.utils.data import random_split
        torch.manual_seed(0)
        a, b = random_split(ds, [8, 2])
    """)
    assert seeded == []


def test_random_dataset_with_rank_offset_seed_is_still_flagged() -> None:
    found = run("SS402", """
        torch.manual_seed(1337 + rank)
        class Noise(torch.utils.data.Dataset):
            def __init__(self):
                self.x = torch.randn(100, 4)
    """)
    assert len(found) == 1 and "Noise.__init__" in found[0].message


def test_model_never_wrapped_on_the_cpu_path() -> None:
    found = run("SS205", """
        def main(args):
            model = torch.nn.Linear(2, 2)
            if not torch.cuda.is_available():
                print("using CPU, this will be slow")
            elif args.distributed:
                model.cuda()
                model = DDP(model, device_ids=[args.gpu])
    """)
    assert len(found) == 1 and found[0].severity == "error" and "CPU path" in found[0].message


def test_model_wrapped_under_a_distributed_test_is_fine() -> None:
    assert run("SS205", """
        def main(ddp):
            model = torch.nn.Linear(2, 2)
            if ddp:
                model = DDP(model)
            if torch.cuda.is_available():
                model = DDP(model, device_ids=[rank])
            else:
                model = DDP(model)
    """) == []


def test_checkpoint_under_local_rank_zero_is_one_writer_per_node() -> None:
    found = run("SS504", """
        class Trainer:
            def __init__(self):
                self.gpu_id = int(os.environ["LOCAL_RANK"])
            def save(self):
                torch.save({}, "snap.pt")
            def train(self):
                if self.gpu_id == 0:
                    self.save()
        if int(os.environ["LOCAL_RANK"]) == 0:
            torch.save({}, "b.pt")
        if rank == 0:
            torch.save({}, "c.pt")
    """)
    # at the guard a user changes: the caller's `if self.gpu_id == 0:`, not the save in save()
    assert [f.line for f in found] == [14, 17]


def test_checkpoint_on_every_rank_under_torchrun() -> None:
    found = run("SS502", """
        torch.save({}, "ckpt.pt")
    """)
    assert len(found) == 1


def test_clip_before_unscale() -> None:
    found = run("SS604", """
        def step(scaler, loss, model, opt, amp):
            if amp:
                scaler.scale(loss).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(opt)
            else:
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        def good(scaler, loss, model, opt):
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    """)
    assert [f.line for f in found] == [11] and "unscale_" in found[0].fix


def test_cuda_by_index_and_map_location() -> None:
    found = run("SS104", """
        local_rank = int(os.environ["LOCAL_RANK"])
        model = torch.nn.Linear(2, 2).to(local_rank)
        x = torch.randn(2).to(local_rank)
        mapping = {"cuda:%d" % 0: "cuda:%d" % local_rank}
        state = torch.load("m.pt", map_location=mapping)
        device = torch.device("cpu")
        y = x.to(device)
    """)
    assert [f.line for f in found] == [9, 12] and "and 1 more" in found[0].message


def test_every_rule_documents_its_false_positives() -> None:
    for rule in all_rules():
        assert "false positive" in rule.explain.lower(), rule.code


def test_print_right_before_leaving_is_not_flagged() -> None:
    assert run("SS501", """
        import sys
        def main():
            if torch.cuda.device_count() < 2:
                print("needs 2 GPUs")
                sys.exit()
            print("training")
        main()
    """)[0].line == 13


# --- second corpus: idioms of the PyTorch examples, nanoGPT and the FSDP tutorials ----------

def test_joining_a_process_or_thread_is_not_a_context_manager() -> None:
    found = run("SS105", """
        import threading
        import torch.multiprocessing as mp
        workers = [mp.Process(target=print) for _ in range(2)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        watcher = threading.Thread(target=print)
        watcher.start()
        watcher.join()
        net = DDP(torch.nn.Linear(2, 2))
        net.join()
    """)
    assert [f.line for f in found] == [19] and "net.join" in found[0].message


def test_set_epoch_on_a_sampler_passed_to_a_helper_counts() -> None:
    script = """
        from torch.utils.data import DataLoader, DistributedSampler
        def fit(net, loader, epoch, sampler=None):
            if sampler:
                sampler.set_epoch(epoch)
            for x in loader:
                net(x)
        def main(net, train_set, eval_set):
            fit_sampler = DistributedSampler(train_set, shuffle=True)
            check_sampler = DistributedSampler(eval_set)
            fit_loader = DataLoader(train_set, sampler=fit_sampler)
            check_loader = DataLoader(eval_set, sampler=check_sampler)
            for epoch in range(3):
                fit(net, fit_loader, epoch, sampler=fit_sampler)
                for x in check_loader:
                    net(x)
    """
    # the training sampler is advanced through the helper's parameter; the other feeds
    # evaluation only, where the order does not matter
    assert run("SS302", script) == []
    never = script.replace("sampler.set_epoch(epoch)", "pass")
    assert [f.line for f in run("SS302", never)] == [15, 16]


def test_backend_default_overridden_by_an_exec_config_is_one_info() -> None:
    found = run("SS204", """
        backend = 'nccl'
        steps = 10
        exec(open('overrides.py').read())
        torch.distributed.init_process_group(backend=backend)
    """, head="import torch\n")
    assert [(f.line, f.severity) for f in found] == [(3, "info")]
    assert "overridable default" in found[0].message
    fixed = run("SS204", """
        backend = 'nccl'
        torch.distributed.init_process_group(backend=backend)
    """, head="import torch\n")
    assert [(f.line, f.severity) for f in fixed] == [(4, "warning")]


def test_print_behind_a_verbose_or_debug_switch_is_opted_into() -> None:
    found = run("SS501", """
        class Tokens(torch.utils.data.Dataset):
            def __init__(self, show_samples=False, verbose=False):
                self.print_text = show_samples
                self.verbose = verbose
            def __getitem__(self, i):
                if self.print_text:
                    print("sample", i)
                if self.verbose and i == 0:
                    print("first sample")
                print("item")
                self.seen = i
            def __len__(self):
                return 4
        loader = torch.utils.data.DataLoader(Tokens())
    """)
    assert [f.line for f in found] == [17]


def test_batchnorm_under_ddp_is_advice_not_a_warning() -> None:
    found = run("SS603", """
        net = DDP(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)))
    """)
    assert [f.severity for f in found] == ["info"]


def test_ss104_device_ids_given_the_global_rank() -> None:
    # DiT: `device = rank % torch.cuda.device_count()`, then `DDP(..., device_ids=[rank])`
    source = """
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        def main():
            dist.init_process_group("nccl")
            rank = dist.get_rank()
            device = rank % torch.cuda.device_count()
            model = DDP(torch.nn.Linear(2, 2).to(device), device_ids=[rank])
    """
    found = check_source(textwrap.dedent(source), "train.py", select_rules(["SS104"], gated=False))
    assert [f.line for f in found] == [9] and "device_ids=[device]" in found[0].fix
    fixed = textwrap.dedent(source).replace("device_ids=[rank]", "device_ids=[device]")
    assert check_source(fixed, "train.py", select_rules(["SS104"], gated=False)) == []
    # the tutorial's spawned rank with no local index taken from it: not this mistake
    alone = textwrap.dedent(source).replace("device = rank % torch.cuda.device_count()",
                                            "device = rank")
    assert check_source(alone, "train.py", select_rules(["SS104"], gated=False)) == []
