"""What `check` could not see, and who runs a line: modules it could not read (listed once,
not claimed on), namespace packages and star imports resolved, the launching process that is
not a rank, and per-rank output that is deliberate."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from splitsync.check import check_paths, check_source, select_rules
from splitsync.check.model import Finding
from splitsync.check.report import not_read, render_json, render_text

HEAD = ("import logging\nimport torch\nimport torch.distributed as dist\n"
        "dist.init_process_group()\nrank = dist.get_rank()\nworld_size = dist.get_world_size()\n")


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def _codes(findings: list, *, shown: bool = False) -> list[tuple[str, str, int]]:
    return [(Path(f.path).name, f.code, f.line) for f in findings
            if not shown or f.severity in ("warning", "error")]


OVERRIDE = """
    import builtins
    import torch.distributed as dist


    def setup_for_distributed(is_master):
        builtin_print = builtins.print

        def print(*args, **kwargs):
            force = kwargs.pop("force", False)
            if is_master or force:
                builtin_print(*args, **kwargs)

        builtins.print = print


    def init():
        dist.init_process_group("gloo")
        setup_for_distributed(dist.get_rank() == 0)
"""

SCRIPT = """
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    {imp}

    init()
    model = DDP(torch.nn.Linear(2, 2))
    print("training")
"""


def test_namespace_package_is_read_from_an_ancestor_folder(tmp_path: Path) -> None:
    # `mylib/` has no __init__.py (a namespace package Python imports fine)
    _write(tmp_path, {"mylib/dist.py": OVERRIDE,
                      "tools/train.py": SCRIPT.format(imp="from mylib.dist import init")})
    findings, files = check_paths([tmp_path / "tools" / "train.py"],
                                  select_rules(["SS501", "SS202"], gated=False))
    assert files == 2 and findings == []  # the override is seen: no print, no missing init


def test_star_import_in_a_package_init_carries_the_print_override(tmp_path: Path) -> None:
    _write(tmp_path, {"utils/__init__.py": "from .dist import *\n", "utils/dist.py": OVERRIDE,
                      "train.py": SCRIPT.format(imp="from utils import init")})
    findings, files = check_paths([tmp_path / "train.py"], select_rules(["SS501", "SS202"],
                                                                        gated=False))
    assert files == 3 and findings == []


def test_a_module_not_read_is_listed_once_and_nothing_depending_on_it_is_claimed(
        tmp_path: Path) -> None:
    _write(tmp_path, {"train.py": """
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        from helpers_not_given import init_distributed, make_loader, seed_all

        init_distributed()
        seed_all(0)
        model = DDP(torch.nn.Linear(2, 2))
        loader = make_loader()
        for x in loader:
            model(x).sum().backward()
    """, "other.py": "from helpers_not_given import seed_all\nimport os\nimport torch\n"})
    findings, _ = check_paths([tmp_path / "train.py", tmp_path / "other.py"])
    # no "no init" (SS202), no "no sampler" (SS301), no "no seed" (SS401): all depend on it
    assert [f for f in findings if f.code != "SS003"] == []
    assert [(Path(f.path).name, f.line) for f in findings] == [("train.py", 4), ("other.py", 1)]
    assert list(not_read(findings)) == ["helpers_not_given"]  # one module, two places
    doc = json.loads(render_json(findings, 2))
    assert doc["findings"] == [] and list(doc["not_read"]) == ["helpers_not_given"]
    assert len(doc["not_read"]["helpers_not_given"]) == 2
    import io
    out = io.StringIO()
    render_text(findings, 2, out)
    text = out.getvalue()
    assert "No problems found" in text and text.count("helpers_not_given") == 1
    assert "Not read:" in text and "pass them too" in text


def test_the_same_script_with_its_helper_given_is_claimed(tmp_path: Path) -> None:
    _write(tmp_path, {"helpers_given.py": """
        import torch
        def init_distributed():
            pass
        def make_loader():
            return [torch.zeros(2)]
        def seed_all(s):
            pass
    """, "train.py": """
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        from helpers_given import init_distributed, make_loader, seed_all

        init_distributed()
        model = DDP(torch.nn.Linear(2, 2))
        loader = make_loader()
        for x in loader:
            model(x).sum().backward()
    """})
    findings, _ = check_paths([tmp_path / "train.py"])
    assert {"SS301", "SS401"} <= {f.code for f in findings}
    assert not any(f.code == "SS003" for f in findings)


def test_installed_standard_and_optional_imports_are_not_listed(tmp_path: Path) -> None:
    _write(tmp_path, {"train.py": """
        import os, json
        import torch
        try:
            import apex_not_installed
        except ImportError:
            apex_not_installed = None
    """})
    findings, _ = check_paths([tmp_path / "train.py"])
    assert findings == []



def test_an_optional_import_after_a_from_import_is_not_listed(tmp_path: Path) -> None:
    # a from-import not found first walks the file's try statements; the optional import
    # under them stays unlisted whatever order the imports come in
    _write(tmp_path, {"train.py": """
        from helpers_not_given import setup
        try:
            import apex_not_installed
        except ImportError:
            apex_not_installed = None
    """})
    findings, _ = check_paths([tmp_path / "train.py"])
    assert [f.message for f in findings if "apex_not_installed" in f.message] == []
    assert any("helpers_not_given" in f.message for f in findings)

def _ss501(source: str) -> list[int]:
    return [f.line for f in check_source(HEAD + textwrap.dedent(source), "case.py",
                                         select_rules(["SS501"], gated=False))]


def test_the_launching_process_is_not_a_rank() -> None:
    lines = _ss501("""
        import torch.multiprocessing as mp

        def show_config(cfg):
            print("config", cfg)

        def worker(rank, world):
            print("loss", 1.0)

        def main():
            show_config({})
            print("starting")
            mp.spawn(worker, args=(2,), nprocs=2)

        if __name__ == "__main__":
            show_config(1)
            main()
    """)
    assert lines == [14]  # worker's print only: show_config runs once, in the parent


def test_a_helper_the_spawned_function_calls_still_runs_on_every_rank() -> None:
    lines = _ss501("""
        import torch.multiprocessing as mp

        def report(x):
            print("value", x)

        def worker(rank, world):
            report(1.0)

        def main():
            mp.spawn(worker, args=(2,), nprocs=2)

        if __name__ == "__main__":
            main()
    """)
    assert lines == [11]


def test_forced_prints_mean_print_is_replaced_even_when_the_override_is_not_read() -> None:
    assert _ss501("""
        def train():
            print("shard sizes", 3, force=True)
            print("loss", 1.0)
        train()
    """) == []


def test_prints_serialised_by_barriers_are_deliberate() -> None:
    assert _ss501("""
        def train():
            for r in range(world_size):
                if r == rank:
                    print("my shard", 3)
                dist.barrier()
        train()
    """) == []
    assert _ss501("""
        def train():
            for r in range(world_size):
                print("my shard", 3)
        train()
    """) == [10]


def test_handlers_levelled_by_rank_silence_logging() -> None:
    for setup in ("if rank != 0:\n    for h in logging.getLogger().handlers:\n"
                  "        h.setLevel(logging.ERROR)\n",
                  "handler = logging.StreamHandler()\n"
                  "handler.setLevel(logging.INFO if rank == 0 else logging.ERROR)\n"
                  "logging.getLogger().addHandler(handler)\n"):
        source = HEAD + "logging.basicConfig(level=logging.INFO)\n" + setup + textwrap.dedent("""
            def train():
                logging.info("step")
            train()
        """)
        assert check_source(source, "case.py", select_rules(["SS503"], gated=False)) == []
    twin = HEAD + "logging.basicConfig(level=logging.INFO)\ndef train():\n    logging.info('s')\n"
    assert len(check_source(twin + "train()\n", "case.py", select_rules(["SS503"], gated=False))) == 1


def test_a_test_on_a_gpu_count_keeps_a_cpu_path() -> None:
    source = textwrap.dedent("""
        import torch
        num_gpus = torch.cuda.device_count()
        if num_gpus >= 2:
            device = torch.device("cuda", 0)
        else:
            device = torch.device("cuda", 0) if num_gpus == 1 else torch.device("cpu")
    """)
    assert check_source(source, "case.py", select_rules(["SS101"], gated=False)) == []
    twin = "import torch\ndevice = torch.device('cuda', 0)\n"
    assert len(check_source(twin, "case.py", select_rules(["SS101"], gated=False))) == 1


def _unread(module: str, path: str, line: int) -> Finding:
    return Finding("SS003", "not-read", "info", f"`{module}` is imported here but was not read",
                   "pass it", path, line, 1, line)


def test_the_not_read_list_is_sorted_by_module_then_place() -> None:
    # the order findings arrive in (one file's after another's, as processes finish) is lost
    found = [_unread("zeta", "b.py", 10), _unread("alpha", "b.py", 9), _unread("zeta", "a.py", 30),
             _unread("zeta", "b.py", 9), _unread("alpha", "a.py", 2)]
    assert not_read(found) == {"alpha": ["a.py:2", "b.py:9"],
                               "zeta": ["a.py:30", "b.py:9", "b.py:10"]}
    assert not_read(reversed(found)) == not_read(found)


@pytest.mark.slow
def test_worker_processes_list_the_same_modules_not_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a package found on this process's import path only (a worker, started with `-m`, has
    # its own folder first): installed for every file, whichever process reads it
    (tmp_path / "site" / "only_on_my_path").mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [str(tmp_path / "site"), *sys.path])
    project = tmp_path / "project"
    _write(project, {f"train_{i}.py": """
        import torch
        from only_on_my_path.dist import setup
        from nowhere_to_be_found.data import make_loader
        print(setup, make_loader)
    """ for i in range(8)})
    files = sorted(project.glob("*.py"))
    alone, _ = check_paths(files, jobs=1)
    for _ in range(2):
        together, _ = check_paths(files, jobs=2)
        assert not_read(together) == not_read(alone)
    assert not_read(alone) == {"nowhere_to_be_found.data": [f"{f}:4" for f in files]}
