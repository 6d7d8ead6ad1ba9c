"""The ``launch`` package: callable as ``splitsync.launch(fn, ...)``, light to import."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest


def test_splitsync_launch_is_the_package_and_callable() -> None:
    import splitsync

    assert callable(splitsync.launch)
    assert splitsync.launch is sys.modules["splitsync.launch"]
    assert isinstance(splitsync.launch, types.ModuleType)
    from splitsync.launch import spec  # submodules stay reachable through the package

    assert splitsync.launch.spec is spec


def test_calling_forwards_to_notebook_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    import splitsync
    import splitsync.launch.notebook as notebook

    seen: list[tuple] = []
    monkeypatch.setattr(notebook, "notebook_launch",
                        lambda fn, nprocs=1, args=(), **kw: seen.append((fn, nprocs, args, kw)) or 7)
    assert splitsync.launch(print, nprocs=2, args=(1,), start_method="spawn") == 7
    assert seen == [(print, 2, (1,), {"start_method": "spawn"})]


def test_importing_splitsync_and_launch_modules_leaves_torch_unloaded() -> None:
    code = ("import sys, splitsync; splitsync.launch; "
            "import splitsync.launch.spec, splitsync.launch.argv, splitsync.launch.cluster, "
            "splitsync.launch.agent, splitsync.launch.rendezvous, splitsync.launch.notebook, "
            "splitsync.commands.run; "
            "assert callable(splitsync.launch); "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
