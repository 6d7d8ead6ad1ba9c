"""The false positives issue 33 lists, each written from the real script's idiom: the
checker stays quiet where the code shows the finding does not hold, and the same code
without that evidence is reported, so each quiet case can fail."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from splitsync.check import check_file, check_source, select_rules
from splitsync.check.registry import all_rules

QUIET = Path(__file__).parent / "check_cases" / "evidence" / "quiet"
DDP = ("import contextlib, os, logging\nimport torch\nimport torch.distributed as dist\n"
       "from torch.nn.parallel import DistributedDataParallel as DDP\n"
       "dist.init_process_group('gloo')\ntorch.manual_seed(0)\n")


def codes(source: str, code: str) -> list[int]:
    found = check_source(DDP + textwrap.dedent(source), "case.py",
                         select_rules([code], gated=False))
    return [f.line for f in found if f.code == code]


# (rule, code with the evidence, the evidence, the same code without it)
CASES = [
    # `.item()` under `if master_process and step % N == 0:` does not run every step
    ("SS601", """
        model = DDP(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        master_process = dist.get_rank() == 0
        for step in range(100):
            loss = model(torch.randn(2, 4)).sum()
            loss.backward()
            opt.step()
            if master_process and step % 10 == 0:
                print(step, loss.item())
    """, "master_process and step % 10 == 0", "master_process"),
    # `.item()` on a CPU tensor waits for nothing
    ("SS601", """
        model = DDP(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(100):
            seen = torch.zeros(1)
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            count = seen.item()
    """, "seen = torch.zeros(1)", "seen = torch.zeros(1, device='cuda')"),
    # one process, holding a file lock, downloads and reports; the others find it done
    ("SS505", """
        from filelock import FileLock
        def fetch(path):
            with FileLock(path + ".lock"):
                if not os.path.exists(path):
                    with open(path, "w") as fh:
                        fh.write("weights")
        fetch("weights.bin")
    """, 'with FileLock(path + ".lock"):', "if True:"),
    ("SS501", """
        from filelock import FileLock
        def fetch(path):
            with FileLock(path + ".lock"):
                if not os.path.exists(path):
                    print("downloading", path)
        fetch("weights.bin")
    """, 'with FileLock(path + ".lock"):', "if True:"),
    # the micro-steps enter no_sync through a context bound to a name
    ("SS602", """
        model = DDP(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler()
        for step, fp16 in enumerate([True, False] * 8):
            last = (step + 1) % 4 == 0
            loss = model(torch.randn(2, 4)).sum()
            ctx = contextlib.nullcontext() if last else model.no_sync()
            if fp16:
                with contextlib.nullcontext() if last else model.no_sync():
                    scaler.scale(loss).backward()
            else:
                with ctx:
                    loss.backward()
            if last:
                opt.step()
    """, "ctx = contextlib.nullcontext() if last else model.no_sync()",
     "ctx = contextlib.nullcontext()"),
    # `backward` inside a helper that enters `no_sync` for the micro-steps
    ("SS602", """
        model = DDP(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        def backward(loss, sync):
            with contextlib.nullcontext() if sync else model.no_sync():
                loss.backward()
        for i in range(16):
            loss = model(torch.randn(2, 4)).sum()
            backward(loss, sync=(i + 1) % 4 == 0)
            if (i + 1) % 4 == 0:
                opt.step()
                opt.zero_grad()
    """, "with contextlib.nullcontext() if sync else model.no_sync():",
     "with contextlib.nullcontext():"),
    # per-rank file names: `{rank:05d}` in an f-string, `queue<rank>.pth` through a name
    ("SS505", """
        rank = dist.get_rank()
        with open(f"shard_{rank:05d}.txt", "w") as fh:
            fh.write("x")
    """, "shard_{rank:05d}.txt", "shard.txt"),
    ("SS502", """
        def save_queue(args, queue):
            queue_path = os.path.join(args.dump_path, "queue" + str(args.rank) + ".pth")
            torch.save({"queue": queue}, queue_path)
        save_queue(None, None)
    """, '"queue" + str(args.rank) + ".pth"', '"queue.pth"'),
    # Hugging Face examples: INFO on the main process, ERROR elsewhere
    ("SS503", """
        from accelerate import Accelerator
        logger = logging.getLogger(__name__)
        accelerator = Accelerator()
        logging.basicConfig(level=logging.INFO if accelerator.is_local_main_process
                            else logging.ERROR)
        logger.info("***** Running training *****")
    """, "logging.INFO if accelerator.is_local_main_process\n                    else logging.ERROR",
     "logging.INFO"),
    # a print in a function training never calls (build-nanogpt's from_pretrained)
    ("SS501", """
        class GPT(torch.nn.Module):
            @classmethod
            def from_pretrained(cls, model_type):
                print("loading weights from pretrained gpt: %s" % model_type)
                return cls()
        model = DDP(GPT())
    """, "model = DDP(GPT())", "model = DDP(GPT.from_pretrained('gpt2'))"),
    # a print in a helper that only rank 0 calls, from another function
    ("SS501", """
        def summary(model):
            print(model)
        def train(rank):
            model = DDP(torch.nn.Linear(4, 1))
            if rank == 0:
                summary(model)
        train(dist.get_rank())
    """, "    if rank == 0:\n        summary(model)", "    summary(model)"),
]


@pytest.mark.parametrize(("code", "source", "evidence", "without"), CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_quiet_with_the_evidence_reported_without(code: str, source: str, evidence: str,
                                                  without: str) -> None:
    source = textwrap.dedent(source)
    assert evidence in source, evidence
    assert codes(source, code) == []
    assert codes(source.replace(evidence, without), code) != []


def test_a_process_group_created_by_accelerate_partial_state() -> None:
    # OpenVLA's finetune.py: `distributed_state = PartialState()` before the DDP wrap
    source = ("import torch\nfrom accelerate import PartialState\n"
              "from torch.nn.parallel import DistributedDataParallel as DDP\n"
              "distributed_state = PartialState()\nmodel = DDP(torch.nn.Linear(4, 1))\n")
    rules = select_rules(["SS202"], gated=False)
    assert check_source(source, "finetune.py", rules) == []
    without = source.replace("distributed_state = PartialState()", "distributed_state = None")
    assert [f.code for f in check_source(without, "finetune.py", rules)] == ["SS202"]


def test_a_rank_zero_logging_filter_installed_by_a_helper_limits_the_logs() -> None:
    script = QUIET / "olmo_filter" / "train.py"
    assert [f for f in check_file(script, all_rules(gated=False)) if f.code == "SS503"] == []
    # read alone, with INFO made visible, the same logs are reported
    alone = check_source(script.read_text().replace("from util import prepare_cli_environment",
                                                    "logging.basicConfig(level=logging.INFO)"),
                         "train.py", select_rules(["SS503"], gated=False))
    assert [f.line for f in alone] != []


def test_set_epoch_on_a_sampler_a_helper_built_counts() -> None:
    found = check_file(QUIET / "helper_sampler" / "data.py", all_rules(gated=False))
    assert [f for f in found if f.code == "SS302"] == []
    alone = check_source((QUIET / "helper_sampler" / "data.py").read_text() +
                         "\ntorch.distributed.init_process_group()\n", "data.py",
                         select_rules(["SS302"], gated=False))
    assert [f.code for f in alone] == ["SS302"]


def test_three_calls_on_one_line_are_one_finding() -> None:
    lines = codes("a, b, c = torch.zeros(1).cuda(), torch.ones(1).cuda(), torch.zeros(2).cuda()\n",
                  "SS101")
    assert lines == [7]
    found = check_source(DDP + "a, b = torch.zeros(1).cuda(), torch.ones(1).cuda()\n", "c.py",
                         select_rules(["SS101"], gated=False))
    assert "1 more such call." in found[0].message
