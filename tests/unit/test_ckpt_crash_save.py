"""A process killed while saving leaves the previous checkpoint loadable, and resume picks it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from splitsync.testing import clean_env

# Saves step 2, then dies by SIGKILL at the named point of saving step 4.
SCRIPT = textwrap.dedent("""
    import os, signal, sys
    import torch
    from torch import nn
    import splitsync as ss
    from splitsync.ckpt import save as background, store

    root, point = sys.argv[1], sys.argv[2]
    def die(*a, **k):
        os.kill(os.getpid(), signal.SIGKILL)

    run = ss.init(seed=0)
    model = run.model(nn.Linear(4, 3))
    opt = torch.optim.Adam(model.parameters())
    run.resume(root, model=model, optimizer=opt)
    for step in range(1, 5):
        run.backward(model(torch.randn(2, 4)).sum())
        run.step(opt)
        if step == 4:
            if point == "files":  # half of state.pt is on disk
                real = background.write_object
                def half(create, durable, obj):
                    if "model" in obj:  # state.pt
                        with create() as f:
                            f.write(b"x" * 100)
                            durable(f)
                        die()
                    return real(create, durable, obj)
                background.write_object = half
            elif point == "manifest":  # every file written, no manifest yet
                background.manifest_text = die
            elif point == "latest":  # renamed into place, `latest` not yet updated
                real_atomic = store._write_atomic
                def atomic(path, text):
                    if path.name == "latest":
                        die()
                    real_atomic(path, text)
                store._write_atomic = atomic
        if step in (2, 4):
            run.save(root)
    print("not killed")
""")


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("point", "expected"), [("files", 2), ("manifest", 2), ("latest", 4)])
def test_killed_during_save(tmp_path: Path, point: str, expected: int) -> None:
    import torch
    from torch import nn

    import splitsync as ss

    root = tmp_path / "ck"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(root), point], env=clean_env(),
                          capture_output=True, text=True, timeout=100)
    assert proc.returncode == -9, proc.stdout + proc.stderr
    leftovers = {p.name for p in root.iterdir()}
    assert "step-000002" in leftovers
    if point != "latest":
        assert ".tmp-step-000004" in leftovers and "step-000004" not in leftovers
    assert (root / "latest").read_text().strip() == "step-000002"
    with ss.init(seed=0) as run:
        model = run.model(nn.Linear(4, 3))
        opt = torch.optim.Adam(model.parameters())
        state = run.resume(root, model=model, optimizer=opt)
        assert state.step == expected
        assert opt.state_dict()["state"][0]["step"].item() == expected
        run.save(root, step=5)  # the next save clears the dead one's work directory
    assert not any(p.name.startswith(".tmp-") for p in root.iterdir())
