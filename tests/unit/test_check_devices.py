"""SS101 hard-coded CUDA and SS102 device mismatch: a positive and a negative case each."""

from __future__ import annotations

import textwrap

from splitsync.check import check_source, select_rules


def run(code: str, source: str) -> list:
    return check_source(textwrap.dedent(source), "case.py", select_rules([code], gated=False))


def test_ss101_flags_dot_cuda_and_cuda_literals() -> None:
    found = run("SS101", """
        import torch
        x = torch.randn(3).cuda()
        device = torch.device("cuda:0")
        y = torch.ones(2).to("cuda")
        z = torch.zeros(2, device=f"cuda:{0}")
        torch.set_default_device("cuda")
        state = torch.load("ckpt.pt", map_location="cuda:0", weights_only=True)
    """)
    assert [(f.line, f.code) for f in found] == [(3, "SS101"), (4, "SS101"), (5, "SS101"),
                                                  (6, "SS101"), (7, "SS101"), (8, "SS101")]
    assert ".cuda()" in found[0].message and "torch.cuda.is_available()" in found[0].fix
    assert "'cuda:0'" in found[1].message


def test_ss101_flags_unconditional_set_device_and_modulo_device_count() -> None:
    found = run("SS101", """
        import torch
        def train(rank):
            device_id = rank % torch.cuda.device_count()
            torch.cuda.set_device(device_id)
    """)
    assert [f.line for f in found] == [4, 5]
    assert "ZeroDivisionError" in found[0].message
    assert "LOCAL_RANK" in found[0].fix


def test_ss101_accepts_portable_device_choice() -> None:
    found = run("SS101", """
        import torch
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        x = torch.randn(3).to(device)
        if torch.cuda.is_available():
            torch.cuda.set_device(0)
            y = x.cuda()
            d = torch.device("cuda", 0)
        use_cuda = torch.cuda.is_available()
        z = x.cuda() if use_cuda else x
        if device.type == "cuda":
            torch.cuda.synchronize()
    """)
    assert found == []


def test_ss101_ignores_cuda_strings_that_are_not_devices() -> None:
    assert run("SS101", """
        import torch
        is_gpu = device.type == "cuda"
        print("cuda is great")
    """) == []


def test_ss102_flags_the_lessons_model_on_cpu_input_on_gpu() -> None:
    found = run("SS102", """
        import torch
        import torch.nn as nn
        model = nn.Linear(10, 2)
        input_gpu = torch.randn(2, 10).cuda()
        output = model(input_gpu)
    """)
    assert len(found) == 1
    f = found[0]
    assert (f.line, f.severity) == (6, "error")
    assert "`model` is on the CPU (line 4, never moved)" in f.message
    assert "`input_gpu` is on a CUDA GPU (line 5)" in f.message
    assert "Expected all tensors to be on the same device" in f.message
    assert "model.to(device)" in f.fix


def test_ss102_flags_model_moved_but_input_left_on_cpu() -> None:
    found = run("SS102", """
        import torch
        class Net(torch.nn.Module):
            pass
        def step(device):
            net = Net()
            net.to(device)
            x = torch.randn(4, 10)
            return net(x)
    """)
    assert len(found) == 1 and "`net` is on `device` (line 7)" in found[0].message


def test_ss102_accepts_same_device_and_unknown_values() -> None:
    assert run("SS102", """
        import torch
        import torch.nn as nn
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = nn.Linear(10, 2).to(device)
        x = torch.randn(2, 10).to(device)
        out = model(x)
        y = torch.randn(2, 10, device=device)
        out = model(y)
        cpu_model = nn.Linear(10, 2)
        out = cpu_model(torch.randn(2, 10))
        out = model(batch)
        x = x.to(torch.float16)
        out = model(x)
    """) == []


def test_ss102_follows_splitsync_run_model_and_to_device() -> None:
    assert run("SS102", """
        import torch
        import splitsync
        run = splitsync.init()
        model = run.model(torch.nn.Linear(10, 2))
        x = run.to_device(torch.randn(2, 10))
        out = model(x)
    """) == []
    found = run("SS102", """
        import torch
        import splitsync
        run = splitsync.init()
        model = run.model(torch.nn.Linear(10, 2))
        x = torch.randn(2, 10)
        out = model(x)
    """)
    assert len(found) == 1 and "run.device" in found[0].message


def test_ss103_flags_tensor_move_whose_result_is_dropped() -> None:
    found = run("SS103", """
        import torch
        from torch.utils.data import DataLoader
        loader = DataLoader(data, batch_size=4)
        x = torch.randn(2, 10)
        x.to(device)
        for inputs, labels in loader:
            inputs.to(device)
            labels.cuda()
    """)
    assert [f.line for f in found] == [6, 8, 9] and found[0].severity == "error"
    assert "`x` stays where it was" in found[0].message
    assert found[0].fix == "assign the copy: `x = x.to(device)`."


def test_ss103_accepts_assigned_moves_and_in_place_module_moves() -> None:
    assert run("SS103", """
        import torch
        model = torch.nn.Linear(10, 2)
        model.to(device)
        x = torch.randn(2, 10)
        x = x.to(device)
        for m in modules:
            m.to(device)
    """) == []


MOCO = """
    import torch
    def main_worker(gpu, args, model):
        args.gpu = gpu
        if args.distributed:
            if args.gpu is not None:
                torch.cuda.set_device(args.gpu)
                model.cuda(args.gpu)
            else:
                model.cuda()
        elif args.gpu is not None:
            torch.cuda.set_device(args.gpu)
            model = model.cuda(args.gpu)
            raise NotImplementedError("Only DistributedDataParallel is supported.")
        else:
            {cpu}
        if args.gpu is not None:
            torch.cuda.set_device(args.gpu)
"""


def test_ss101_a_gpu_choice_with_no_cpu_branch_is_no_guard() -> None:
    # MoCo/SimSiam: `if args.gpu is not None:` chooses a GPU (the else branch is CUDA too) and
    # every other path raises: no CPU path, though each `.cuda()` sits under a "gpu" test
    found = run("SS101", MOCO.format(cpu='raise NotImplementedError("DDP only")'))
    assert [f.line for f in found] == [7, 8, 10, 12, 13]
    # a CPU branch makes the test beside it a guard (the distributed path stays CUDA-only),
    # and a lone `if args.gpu is not None:` with no else is one too
    assert [f.line for f in run("SS101", MOCO.format(cpu="model = model.cpu()"))] == [7, 8, 10]
    assert run("SS101", """
        import torch
        def main_worker(gpu, args):
            if not torch.cuda.is_available():
                print("using CPU")
            elif args.gpu is not None:
                torch.cuda.set_device(args.gpu)
            else:
                torch.cuda.set_device(0)
    """) == []
