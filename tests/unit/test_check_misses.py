"""The kinds of mistake `check` used to miss on unseen code (issue 42), each written from the
idiom it was found in, with a silent twin for the look-alike that is correct."""

from __future__ import annotations

import textwrap

import pytest

from splitsync.check import check_source, select_rules

HEAD = ("import os\nimport torch\nimport torch.distributed as dist\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n")


def run(code: str, source: str, head: str = HEAD) -> list:
    return check_source(head + textwrap.dedent(source), "case.py",
                        select_rules([code], gated=False))


# SS210: a wrapper prepared but bypassed ------------------------------------------------

def test_ss210_model_unwrapped_right_after_the_wrap_then_trained() -> None:
    found = run("SS210", """
        def main(trainer_cls):
            dist.init_process_group("nccl")
            model = torch.nn.Linear(2, 2)
            model = DDP(model, device_ids=[int(os.environ["LOCAL_RANK"])])
            model = model.module  # get the original model from the DDP wrapper
            trainer = trainer_cls(model=model)
            trainer.train()
    """)
    assert [f.line for f in found] == [10] and found[0].severity == "error"
    assert "never all-reduced" in found[0].message


def test_ss210_unwrapped_to_save_after_training_is_silent() -> None:
    assert run("SS210", """
        def main(loader):
            dist.init_process_group("gloo")
            model = DDP(torch.nn.Linear(2, 2))
            for x in loader:
                model(x).sum().backward()
            model = model.module
            torch.save(model.state_dict(), "final.pt")
    """) == []


def test_ss210_loss_through_model_module_method() -> None:
    found = run("SS210", """
        class Trainer:
            def train_for_one_epoch(self, model, optim, loader):
                for image in loader:
                    loss = model.module.get_loss(image)
                    optim.zero_grad()
                    loss.backward()
                    optim.step()

            def validate(self, model, loader):
                return sum(model.module.get_loss(x).item() for x in loader)

        def main_worker(rank, net):
            dist.init_process_group("nccl", rank=rank, world_size=2)
            model = DDP(net, device_ids=[rank])
            Trainer().train_for_one_epoch(model, None, [])
    """)
    assert [f.line for f in found] == [9]  # the training step, not the validation


def test_ss210_loss_through_the_wrapper_is_silent() -> None:
    assert run("SS210", """
        def step(model, image, optim):
            loss = model(image)
            loss.backward()
            n = model.module.parameters()
        def main(net):
            dist.init_process_group("nccl")
            model = DDP(net)
            step(model, None, None)
    """) == []


# SS207: a per-rank, data-dependent early exit -----------------------------------------

PPO = """
    def update(model, optimizer, batches, target_kl):
        for epoch in range(4):
            for mb in batches:
                logratio = model(mb)
                ratio = logratio.exp()
                approx_kl = ((ratio - 1) - logratio).mean()
                loss = -ratio.mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            if {test}:
                break
    dist.init_process_group("nccl")
    model = DDP(torch.nn.Linear(2, 2))
"""


def test_ss207_kl_early_stop_on_each_ranks_own_minibatch() -> None:
    found = run("SS207", PPO.format(test="approx_kl > target_kl"))
    assert len(found) == 1 and found[0].severity == "error"
    assert "`if approx_kl > target_kl: break`" in found[0].message
    assert "leaves the loop" in found[0].message


def test_ss207_kl_early_stop_on_a_reduced_value_is_silent() -> None:
    source = PPO.replace("            if {test}:", "            dist.all_reduce(approx_kl)\n"
                         "            if {test}:")
    assert run("SS207", source.format(test="approx_kl > target_kl")) == []
    assert run("SS207", PPO.format(test="epoch >= 3")) == []  # every rank counts alike


def test_ss207_nonfinite_skip_under_accelerate() -> None:
    found = run("SS207", """
        from accelerate import Accelerator
        accelerator = Accelerator()
        model = accelerator.prepare(torch.nn.Linear(2, 2))
        for batch in []:
            loss = model(batch).mean()
            if not loss.isfinite():
                continue
            accelerator.backward(loss)
    """)
    assert len(found) == 1 and "continue" in found[0].message


# SS211: a rank guard defeated by and/or precedence ------------------------------------

def test_ss211_and_then_or_leaves_the_prompt_on_every_rank() -> None:
    found = run("SS211", """
        import shutil
        dist.init_process_group("nccl")
        is_main = dist.get_rank() == 0
        def prepare(out, force):
            if is_main and force or input("delete? ") == "y":
                shutil.rmtree(out)
    """)
    assert len(found) == 1 and "binds tighter" in found[0].message
    assert "is_main and (... or input" in found[0].fix


def test_ss211_bracketed_guard_is_silent() -> None:
    assert run("SS211", """
        import shutil
        dist.init_process_group("nccl")
        is_main = dist.get_rank() == 0
        def prepare(out, force):
            if is_main and (force or input("delete? ") == "y"):
                shutil.rmtree(out)
            if is_main and force or dist.get_rank() == 0:
                pass
    """) == []


# SS212: timedelta(4800) meant as seconds ----------------------------------------------

@pytest.mark.parametrize("call", ["timedelta(4800)", "timedelta(args.timeout_sec)"])
def test_ss212_timeout_in_days(call: str) -> None:
    found = run("SS212", f"""
        from datetime import timedelta
        def setup(args):
            dist.init_process_group("nccl", timeout={call})
    """)
    assert len(found) == 1 and "days" in found[0].message and "seconds=" in found[0].fix


@pytest.mark.parametrize("call", ["timedelta(seconds=4800)", "timedelta(0, 3600)",
                                  "timedelta(minutes=30)", "timedelta(1)"])
def test_ss212_timeouts_with_units_are_silent(call: str) -> None:
    assert run("SS212", f"""
        from datetime import timedelta
        dist.init_process_group("nccl", timeout={call})
        deadline = timedelta(90)  # date arithmetic, not a timeout
    """) == []


# SS213: a SLURM branch that never reads the world size --------------------------------

SLURM = """
    def init_distributed_mode(args):
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            args.rank = int(os.environ["RANK"])
            args.world_size = int(os.environ["WORLD_SIZE"])
        elif "SLURM_PROCID" in os.environ:
            args.rank = int(os.environ["SLURM_PROCID"])
            args.gpu = args.rank % torch.cuda.device_count()
            {extra}
        dist.init_process_group(backend="nccl", init_method=args.dist_url,
                                world_size=args.world_size, rank=args.rank)
"""


def test_ss213_slurm_branch_without_world_size() -> None:
    found = run("SS213", SLURM.format(extra="pass"))
    assert len(found) == 1 and found[0].line == 10 and "never its world size" in found[0].message


def test_ss213_slurm_branch_reading_ntasks_is_silent() -> None:
    assert run("SS213", SLURM.format(
        extra='args.world_size = int(os.environ["SLURM_NTASKS"])')) == []


# SS214: DDP on a path that never initialises a group ----------------------------------

def test_ss214_ddp_on_the_path_without_a_group() -> None:
    found = run("SS214", """
        def main(args):
            if args.distributed:
                dist.init_process_group("nccl")
            model = torch.nn.Linear(2, 2)
            model = DDP(model)
    """)
    assert len(found) == 1 and "args.distributed" in found[0].message


def test_ss214_wrap_under_the_same_test_is_silent() -> None:
    assert run("SS214", """
        def main(args):
            if args.distributed:
                dist.init_process_group("nccl")
            model = torch.nn.Linear(2, 2)
            if args.distributed:
                model = DDP(model)
        def other(args):
            if args.distributed:
                dist.init_process_group("nccl")
            else:
                dist.init_process_group("gloo", world_size=1, rank=0)
            model = DDP(torch.nn.Linear(2, 2))
    """) == []


# SS510: a shared folder named from each rank's clock ----------------------------------

def test_ss510_checkpoint_folder_from_each_ranks_clock() -> None:
    found = run("SS510", """
        from datetime import datetime
        from accelerate import Accelerator
        accelerator = Accelerator()
        def save(step):
            stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
            out = f"ckpt/{stamp}-{step}"
            accelerator.save_state(out)
    """)
    assert len(found) == 1 and "split across them" in found[0].message


def test_ss510_broadcast_or_step_named_folder_is_silent() -> None:
    assert run("SS510", """
        from datetime import datetime
        from accelerate import Accelerator
        accelerator = Accelerator()
        def save(step):
            stamp = [datetime.now().strftime("%Y%m%d-%H%M%S")]
            dist.broadcast_object_list(stamp, src=0)
            accelerator.save_state(f"ckpt/{stamp[0]}")
            accelerator.save_state(f"ckpt/step-{step}")
    """) == []


# SS107: a GPU chosen by the global rank modulo the device count --------------------------

def test_ss107_slurm_branch_reads_the_local_id_but_takes_the_global_rank() -> None:
    found = run("SS107", """
        def init_distributed_mode(args):
            if "SLURM_PROCID" in os.environ:
                args.rank = int(os.environ["SLURM_PROCID"])
                args.world_size = int(os.environ["SLURM_NTASKS"])
                args.local_rank = int(os.environ["SLURM_LOCALID"])
                args.gpu = args.rank % torch.cuda.device_count()
            torch.cuda.set_device(args.gpu)
            dist.init_process_group("nccl", rank=args.rank, world_size=args.world_size)
    """)
    assert [f.line for f in found] == [11] and found[0].severity == "warning"
    assert "SLURM_LOCALID" in found[0].fix and "line 10" in found[0].message


def test_ss107_torchrun_local_rank_read_but_the_device_from_get_rank() -> None:
    found = run("SS107", """
        def main():
            dist.init_process_group("nccl")
            rank = dist.get_rank()
            local_rank = int(os.environ["LOCAL_RANK"])
            n_gpus = torch.cuda.device_count()
            device = f"cuda:{rank % n_gpus}"
            torch.cuda.set_device(int(os.environ["RANK"]) % torch.cuda.device_count())
            print(local_rank, device)
    """)
    assert [f.line for f in found] == [11, 12]
    assert "LOCAL_RANK" in found[0].fix


def test_ss107_no_local_rank_at_hand_or_a_local_one_is_silent() -> None:
    assert run("SS107", """
        def init_distributed_mode(args):
            if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
                args.rank = int(os.environ["RANK"])
                args.gpu = int(os.environ["LOCAL_RANK"])
            elif "SLURM_PROCID" in os.environ:  # another path: LOCAL_RANK is not read here
                args.rank = int(os.environ["SLURM_PROCID"])
                args.gpu = args.rank % torch.cuda.device_count()
                os.environ["LOCAL_RANK"] = str(args.gpu)  # written, not read
            torch.cuda.set_device(args.gpu)
            dist.init_process_group("nccl", rank=args.rank)

        def worker(rank, world_size):  # the index mp.spawn passes
            dist.init_process_group("nccl", rank=rank, world_size=world_size)
            local_rank = rank
            torch.cuda.set_device(rank % torch.cuda.device_count())

        def main(args):
            dist.init_process_group("nccl")
            rank = dist.get_rank()
            device = rank % torch.cuda.device_count()  # nothing better at hand

        def local(args):
            local_rank = int(os.environ["LOCAL_RANK"])
            torch.cuda.set_device(local_rank % torch.cuda.device_count())
            args.rank = int(os.environ["RANK"])
            args.rank = args.rank * 8 + args.gpu  # not the launcher's rank alone
            torch.cuda.set_device(args.rank % torch.cuda.device_count())
            step = dist.get_rank() % 4  # not a device count
    """) == []


# SS206: DDP device_ids for a module built on the CPU and never moved ----------------------

def test_ss206_ported_classification_script_wraps_a_cpu_model_with_device_ids() -> None:
    found = run("SS206", """
        import torchvision.models as models

        def main_worker(gpu, ngpus_per_node, args):
            dist.init_process_group("gloo", rank=gpu, world_size=ngpus_per_node)
            if args.pretrained:
                model = models.__dict__[args.arch](pretrained=True)
            else:
                model = models.__dict__[args.arch]()
            model.train()
            model = DDP(model, device_ids=[gpu])

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(4, 2)

        def other(local_rank):
            dist.init_process_group("gloo")
            net = Net().to("cpu")
            ddp = torch.nn.parallel.DistributedDataParallel(net, device_ids=[local_rank],
                                                            output_device=local_rank)
    """)
    assert [f.line for f in found] == [15, 25]
    assert "built on the CPU" in found[0].message and "line 11" in found[0].message
    assert found[0].severity == "error"


def test_ss206_model_moved_passed_on_or_unknown_is_silent() -> None:
    assert run("SS206", """
        import torchvision.models as models

        def moved(gpu, args):
            dist.init_process_group("nccl")
            model = models.__dict__[args.arch]()
            model.cuda(gpu)
            model = DDP(model, device_ids=[gpu])

        def moved_on_a_branch(gpu, args):
            model = models.resnet50()
            if args.gpu is not None:
                model = model.to(gpu)
            model = DDP(model, device_ids=[gpu])

        def handed_on(gpu, build):
            model = build()
            helper = prepare(model)
            model = DDP(model, device_ids=[gpu])

        def parameter(model, gpu):
            return DDP(model, device_ids=[gpu])

        def in_device_context(gpu):
            with torch.device("cuda", gpu):
                model = torch.nn.Linear(2, 2)
            return DDP(model, device_ids=[gpu])

        def one_branch_loads_elsewhere(gpu, args):
            if args.pretrained:
                model = models.resnet50()
            else:
                model = load_model(args.path)
            model = DDP(model, device_ids=[gpu])

        def cpu_wrap():
            model = torch.nn.Linear(2, 2)
            return DDP(model, device_ids=None, output_device=None)
    """) == []


# SS506 beyond evaluation: a training figure from rank 0's shard reported as the epoch's ----

SHARDED_MAIN = """
        def main(dataset, model, optimizer, epochs):
            dist.init_process_group("gloo")
            rank = dist.get_rank()
            sampler = torch.utils.data.DistributedSampler(dataset)
            loader = torch.utils.data.DataLoader(dataset, batch_size=32, sampler=sampler)
            for epoch in range(epochs):
                sampler.set_epoch(epoch)
                train(model, loader, optimizer, epoch, rank)
"""


def test_ss506_training_loss_and_accuracy_printed_on_rank0_from_its_shard() -> None:
    found = run("SS506", """
        def train(model, loader, optimizer, epoch, rank):
            model.train()
            total_loss, correct, step = 0.0, 0, 0
            for data, target in loader:
                optimizer.zero_grad()
                output = model(data)
                loss = torch.nn.functional.cross_entropy(output, target)
                loss.backward()
                optimizer.step()
                total_loss += loss.item()
                correct += (output.argmax(1) == target).sum().item()
                step += 1
            if rank == 0:
                print(f"epoch {epoch}: loss {total_loss / len(loader):.4f}, "
                      f"accuracy {correct / len(loader.dataset):.2%}")
    """ + SHARDED_MAIN)
    assert [f.line for f in found] == [19] and found[0].severity == "warning"
    assert "rank 0 only" in found[0].message


def test_ss506_reduced_counted_or_every_rank_training_figures_are_silent() -> None:
    assert run("SS506", """
        def train(model, loader, optimizer, epoch, rank):
            model.train()
            total_loss, step = torch.zeros(()), 0
            for data, target in loader:
                loss = model(data).sum()
                loss.backward()
                total_loss += loss.detach()
                step += 1
            dist.all_reduce(total_loss)
            if rank == 0:
                print(f"epoch {epoch}: loss {total_loss.item() / step:.4f}")

        def count(model, loader, rank):
            model.train()
            step, seen = 0, 0
            for data, target in loader:
                model(data).sum().backward()
                step += 1
                seen += data.size(0)
            if rank == 0:
                print(f"{step} steps, {seen} samples")

        def every_rank(model, loader, rank):
            model.train()
            running = 0.0
            for data, target in loader:
                loss = model(data).sum()
                loss.backward()
                running += loss.item()
            print(f"rank {rank}: loss {running:.4f}")  # deliberately per rank

        def reset(model, loader, rank):
            model.train()
            total = 0.0
            for data, target in loader:
                loss = model(data).sum()
                loss.backward()
                total += loss.item()
            total = torch.tensor(total)
            if rank == 0:
                print(total)

        def main(dataset, model, epochs):
            dist.init_process_group("gloo")
            rank = dist.get_rank()
            sampler = torch.utils.data.DistributedSampler(dataset)
            loader = torch.utils.data.DataLoader(dataset, sampler=sampler)
            train(model, loader, None, 0, rank)
            count(model, loader, rank)
            every_rank(model, loader, rank)
            reset(model, loader, rank)
    """) == []


# SS302 reported at the epoch loop when the sampler is built in another function ----------

def test_ss302_points_at_the_epoch_loop_far_from_the_sampler() -> None:
    found = run("SS302", """
        def build_loader(dataset):
            sampler = torch.utils.data.DistributedSampler(dataset, shuffle=True)
            return torch.utils.data.DataLoader(dataset, batch_size=8, sampler=sampler)

        def train_one_epoch(model, loader, optimizer):
            for x, y in loader:
                model(x).sum().backward()
                optimizer.step()

        def main(dataset, model, optimizer):
            dist.init_process_group("gloo")
            train_loader = build_loader(dataset)
            for epoch in range(10):
                train_one_epoch(model, train_loader, optimizer)
    """)
    assert [f.line for f in found] == [18]
    assert "line 7, in build_loader()" in found[0].message


def test_ss302_same_function_or_several_loops_stay_at_the_sampler() -> None:
    found = run("SS302", """
        def main(dataset, model):
            dist.init_process_group("gloo")
            sampler = torch.utils.data.DistributedSampler(dataset)
            loader = torch.utils.data.DataLoader(dataset, sampler=sampler)
            for epoch in range(10):
                for x in loader:
                    model(x).sum().backward()

        def build(dataset):
            return torch.utils.data.DataLoader(
                dataset, sampler=torch.utils.data.DistributedSampler(dataset))

        def twice(dataset, model):
            loader = build(dataset)
            for epoch in range(3):
                for x in loader:
                    model(x).sum().backward()
            for epoch in range(3):
                for x in loader:
                    model(x).sum().backward()
    """)
    assert [f.line for f in found] == [8, 16]
    assert all(f.message.startswith("`torch.utils.data.DistributedSampler(") for f in found)


def test_ss302_loaders_returned_as_a_pair_point_at_the_loop_over_the_training_one() -> None:
    found = run("SS302", """
        def build_loaders(train_set, val_set):
            train_sampler = torch.utils.data.DistributedSampler(train_set)
            val_sampler = torch.utils.data.DistributedSampler(val_set, shuffle=False)
            train_loader = torch.utils.data.DataLoader(train_set, sampler=train_sampler)
            val_loader = torch.utils.data.DataLoader(val_set, sampler=val_sampler)
            return train_loader, val_loader

        def main(train_set, val_set, model):
            dist.init_process_group("gloo")
            train_loader, val_loader = build_loaders(train_set, val_set)
            for epoch in range(10):
                for x in train_loader:
                    model(x).sum().backward()
                for x in val_loader:
                    model(x)
    """)
    assert [f.line for f in found] == [16] and "line 7, in build_loaders()" in found[0].message
