"""Checkpoints in object storage through fsspec: memory, local and a real S3 server on loopback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

import splitsync as ss
from splitsync.ckpt import CheckpointWarning, SaveHandle
from splitsync.errors import CheckpointError
from splitsync.testing import clean_env

fsspec = pytest.importorskip("fsspec")


@pytest.fixture(scope="module")
def s3_env() -> Iterator[dict[str, str]]:
    """moto's standalone S3 server on 127.0.0.1, with s3fs pointed at it by environment."""
    pytest.importorskip("s3fs")
    server_mod = pytest.importorskip("moto.server")
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1",
           "FSSPEC_S3_ENDPOINT_URL": f"http://{host}:{port}"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    fsspec.config.set_conf_env(fsspec.config.conf)
    fsspec.filesystem("s3").mkdir("ckpt-test")
    try:
        yield env
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        fsspec.config.conf.pop("s3", None)
        server.stop()


@pytest.fixture(params=["memory", "file", "s3"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return f"memory://ck-{uuid.uuid4().hex}/run"
    if request.param == "file":
        return f"file://{tmp_path}/run"
    request.getfixturevalue("s3_env")
    return f"s3://ckpt-test/{uuid.uuid4().hex}/run"


def _fs(url: str):
    fs, root = fsspec.core.url_to_fs(url)
    fs.invalidate_cache()
    return fs, root


def _build() -> tuple[ss.Run, nn.Module, torch.optim.Optimizer]:
    run = ss.init(seed=0)
    torch.manual_seed(0)
    model = run.model(nn.Linear(4, 3))
    return run, model, torch.optim.AdamW(model.parameters(), lr=0.1)


def _train(run: ss.Run, model: nn.Module, opt: torch.optim.Optimizer, n: int) -> None:
    for _ in range(n):
        run.backward(model(torch.randn(2, 4)).sum())
        run.step(opt)


def test_save_resume_keep_last_k_and_export(url: str) -> None:
    from safetensors.torch import load

    run, model, opt = _build()
    with run:
        run.resume(url, keep=2, model=model, optimizer=opt)
        _train(run, model, opt, 1)
        assert run.save(tag="one") == f"{url}/step-000001"
        _train(run, model, opt, 1)
        handle = run.save(blocking=False)
        assert isinstance(handle, SaveHandle) and handle.path == f"{url}/step-000002"
        assert handle.wait() == handle.path and handle.done()
        _train(run, model, opt, 1)
        run.save(blocking=False, table=torch.arange(4))  # committed by close()
        want = [p.detach().clone() for p in model.parameters()]
        out = run.export(f"{url}/final.safetensors")
    fs, root = _fs(url)
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(root, detail=False))
    assert names == ["final.safetensors", "latest", "step-000002", "step-000003"]
    assert fs.cat_file(f"{root}/latest").decode().strip() == "step-000003"
    assert torch.equal(load(fs.cat_file(f"{root}/final.safetensors"))["weight"], want[0])
    assert out == f"{url}/final.safetensors"

    run, model, opt = _build()
    with run:
        state = run.resume(url, model=model, optimizer=opt)
    assert (state.step, state.path) == (3, f"{url}/step-000003")
    assert torch.equal(state.extra["table"], torch.arange(4))
    for a, b in zip(model.parameters(), want, strict=True):
        assert torch.equal(a, b)
    assert opt.state_dict()["state"][0]["step"].item() == 3


def test_partial_checkpoint_is_ignored_then_removed(url: str, monkeypatch) -> None:
    from splitsync.ckpt import fs as fs_mod
    from splitsync.ckpt import save as background

    run, model, opt = _build()
    with run:
        run.resume(url, model=model, optimizer=opt)
        _train(run, model, opt, 2)
        run.save()
        good = [p.detach().clone() for p in model.parameters()]
        _train(run, model, opt, 2)

        def no_manifest(*_a, **_k):  # every part written, then the manifest write fails
            raise OSError("connection lost")

        monkeypatch.setattr(background, "manifest_text", no_manifest)
        # as a process killed before it could remove what it wrote
        monkeypatch.setattr(fs_mod.ObjectStorage, "discard", lambda *_: None)
        with pytest.raises(CheckpointError, match="rank 0 committing.*step-000004.*connection"):
            run.save()
        monkeypatch.undo()
    fs, root = _fs(url)
    assert fs.exists(f"{root}/step-000004/state.pt")
    assert not fs.exists(f"{root}/step-000004/manifest.json")
    run, model, opt = _build()
    with run:
        with pytest.warns(CheckpointWarning, match="step-000004.*manifest.json is missing"):
            state = run.resume(url, model=model, optimizer=opt)
        assert state.step == 2
        for a, b in zip(model.parameters(), good, strict=True):
            assert torch.equal(a, b)
        run.save(step=3)  # the next save removes the dead one
    fs.invalidate_cache()
    assert not fs.exists(f"{root}/step-000004")


def test_corrupted_object_is_skipped(url: str) -> None:
    run, model, opt = _build()
    with run:
        run.resume(url, model=model, optimizer=opt)
        for _ in range(2):
            _train(run, model, opt, 1)
            run.save()
    fs, root = _fs(url)
    data = bytearray(fs.cat_file(f"{root}/step-000002/state.pt"))
    data[len(data) // 2] ^= 0x01
    fs.pipe_file(f"{root}/step-000002/state.pt", bytes(data))
    run, model, opt = _build()
    with run, pytest.warns(CheckpointWarning, match="step-000002.*XXH3-128 checksum"):
        assert run.resume(url, model=model, optimizer=opt).step == 1


KILLED = textwrap.dedent("""
    import os, signal, sys
    import torch
    from torch import nn
    import splitsync as ss
    from splitsync.ckpt import save as background

    url = sys.argv[1]
    run = ss.init(seed=0)
    model = run.model(nn.Linear(4, 3))
    opt = torch.optim.Adam(model.parameters())
    run.resume(url, model=model, optimizer=opt)
    for step in range(1, 5):
        run.backward(model(torch.randn(2, 4)).sum())
        run.step(opt)
        if step == 4:  # every part of step 4 is uploaded; killed before its manifest
            handle.wait()  # (step 2's save must not be the one killed)
            background.manifest_text = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
        if step in (2, 4):
            handle = run.save(url, blocking=False)
    run.close()
    print("not killed")
""")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_s3_killed_between_last_part_and_manifest(s3_env: dict[str, str]) -> None:
    url = f"s3://ckpt-test/{uuid.uuid4().hex}/run"
    proc = subprocess.run([sys.executable, "-c", KILLED, url], env=clean_env(),  # holds s3_env too
                          capture_output=True, text=True, timeout=150)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    fs, root = _fs(url)
    assert fs.exists(f"{root}/step-000004/state.pt")
    assert fs.exists(f"{root}/step-000004/rank-00000.pt")
    assert not fs.exists(f"{root}/step-000004/manifest.json")
    assert fs.cat_file(f"{root}/latest").decode().strip() == "step-000002"
    run = ss.init(seed=0)
    with run:
        model = run.model(nn.Linear(4, 3))
        opt = torch.optim.Adam(model.parameters())
        with pytest.warns(CheckpointWarning, match="step-000004"):
            state = run.resume(url, model=model, optimizer=opt)
        assert state.step == 2 and opt.state_dict()["state"][0]["step"].item() == 2
        run.save(step=3)
    fs.invalidate_cache()
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(root, detail=False)) == [
        "latest", "step-000002", "step-000003"]
