"""Checkpoint files on disk: keep-last-k, corruption detection, refusal of pickled payloads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch import nn

import splitsync as ss
from splitsync.ckpt import CheckpointWarning
from splitsync.ckpt.store import read_manifest, write_manifest
from splitsync.errors import CheckpointError


def _setup(width: int = 3) -> tuple[ss.Run, nn.Module, torch.optim.Optimizer]:
    run = ss.init(seed=0)
    torch.manual_seed(0)
    model = run.model(nn.Linear(4, width))
    return run, model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _train_and_save(root: Path, steps: tuple[int, ...], keep: int = 3) -> dict[int, list]:
    """Save after each step in ``steps``; return the parameters at each save."""
    run, model, opt = _setup()
    saved = {}
    with run:
        run.resume(root, keep=keep, model=model, optimizer=opt)
        for s in range(1, max(steps) + 1):
            run.backward(model(torch.randn(2, 4)).sum())
            run.step(opt)
            if s in steps:
                run.save(root, tag=s, table=torch.arange(3))
                saved[s] = [p.detach().clone() for p in model.parameters()]
    return saved


def _resume(root: Path) -> tuple[ss.ckpt.ResumeState, nn.Module]:
    run, model, opt = _setup()
    with run:
        return run.resume(root, model=model, optimizer=opt), model


def test_save_commits_manifest_latest_and_keeps_last_k(tmp_path: Path) -> None:
    saved = _train_and_save(tmp_path, (1, 2, 3, 4), keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-000003", "step-000004"]
    assert (tmp_path / "latest").read_text().strip() == "step-000004"
    body = read_manifest(tmp_path / "step-000004")
    assert body["step"] == 4 and {"state.pt", "rank-00000.pt"} <= set(body["files"])
    state, model = _resume(tmp_path)
    assert (state.step, state.extra["tag"]) == (4, 4)
    assert torch.equal(state.extra["table"], torch.arange(3))
    for a, b in zip(model.parameters(), saved[4], strict=True):
        assert torch.equal(a, b)


def test_keep_must_be_at_least_two(tmp_path: Path) -> None:
    run, model, opt = _setup()
    with run, pytest.raises(ValueError, match="keep at least 2"):
        run.resume(tmp_path, keep=1, model=model, optimizer=opt)


def test_fresh_start_when_directory_is_empty(tmp_path: Path) -> None:
    state, _ = _resume(tmp_path / "none")
    assert (state.step, state.epoch, state.resumed) == (0, 0, False)


def _truncate(f: Path) -> None:
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])


def _zero(f: Path) -> None:
    f.write_bytes(b"")


def _flip(f: Path) -> None:
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x10
    f.write_bytes(bytes(data))


@pytest.mark.parametrize(("damage", "target", "reason"), [
    (_truncate, "state.pt", "truncated"),
    (_zero, "rank-00000.pt", "zero bytes"),
    (_flip, "state.pt", "checksum"),
    (os.remove, "manifest.json", "manifest.json is missing"),
    (_flip, "manifest.json", "manifest.json"),
])
def test_damaged_newest_is_skipped_with_named_warning(tmp_path: Path, damage, target: str,
                                                      reason: str) -> None:
    saved = _train_and_save(tmp_path, (2, 4))
    damage(tmp_path / "step-000004" / target)
    with pytest.warns(CheckpointWarning, match=f"step-000004.*{reason}"):
        state, model = _resume(tmp_path)
    assert state.step == 2
    # Set aside, so keep-last-k cannot delete the good one in favour of it.
    assert (tmp_path / ".skipped-step-000004").is_dir()
    assert not (tmp_path / "step-000004").exists()
    for a, b in zip(model.parameters(), saved[2], strict=True):
        assert torch.equal(a, b)


def test_no_good_checkpoint_left_is_a_clear_error(tmp_path: Path) -> None:
    _train_and_save(tmp_path, (2, 4))
    _zero(tmp_path / "step-000004" / "state.pt")
    _truncate(tmp_path / "step-000002" / "state.pt")
    with pytest.warns(CheckpointWarning), pytest.raises(
            CheckpointError, match="no usable checkpoint.*step-000004.*step-000002"):
        _resume(tmp_path)


def test_model_mismatch_names_key_and_shapes_and_loads_nothing(tmp_path: Path) -> None:
    _train_and_save(tmp_path, (1,))
    run, model, opt = _setup(width=5)
    before = [p.detach().clone() for p in model.parameters()]
    with run, pytest.raises(CheckpointError, match=r"'bias'.*\(3,\).*\(5,\)"):
        run.resume(tmp_path, model=model, optimizer=opt)
    for a, b in zip(model.parameters(), before, strict=True):
        assert torch.equal(a, b)


class _Payload:
    def __init__(self, sentinel: str) -> None:
        self.sentinel = sentinel

    def __reduce__(self):  # what a malicious checkpoint would do when unpickled
        return (open, (self.sentinel, "w"))


def test_pickled_payload_is_refused_without_running_it(tmp_path: Path) -> None:
    _train_and_save(tmp_path, (1,))
    ckpt = tmp_path / "step-000001"
    sentinel = tmp_path / "pwned"
    with open(ckpt / "state.pt", "wb") as f:
        torch.save({"objects": _Payload(str(sentinel))}, f, pickle_protocol=2)
    body = read_manifest(ckpt)
    (ckpt / "manifest.json").unlink()
    write_manifest(ckpt, {k: v for k, v in body.items() if k not in ("files", "format")})
    with pytest.raises(CheckpointError, match="refused to load"):
        _resume(tmp_path)
    assert not sentinel.exists()
    torch.load(ckpt / "state.pt", weights_only=False)  # proof the payload is live
    assert sentinel.exists()


def test_extras_must_be_json_or_tensors(tmp_path: Path) -> None:
    run, model, opt = _setup()
    with run:
        run.resume(tmp_path, model=model, optimizer=opt)
        with pytest.raises(TypeError, match="bad"):
            run.save(tmp_path, bad=object())


def test_export_writes_one_safetensors_file(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    run = ss.init(seed=0)
    with run:
        net = nn.Sequential(nn.Embedding(5, 3), nn.Linear(3, 5, bias=False))
        net[1].weight = net[0].weight  # tied weights: written once, as save_pretrained does
        model = run.model(net)
        run.resume(tmp_path / "ck", model=model)
        out = run.export(tmp_path / "final.safetensors")
    loaded = load_file(out)
    assert set(loaded) == {"0.weight"}
    assert torch.equal(loaded["0.weight"], net[0].weight.detach())
    from safetensors.torch import load_model

    again = nn.Sequential(nn.Embedding(5, 3), nn.Linear(3, 5, bias=False))
    again[1].weight = again[0].weight
    load_model(again, out)  # safetensors' own loader: the tie stands, both names filled
    assert torch.equal(again[1].weight, net[0].weight.detach())


def test_scheduler_and_scaler_state_round_trip(tmp_path: Path) -> None:
    def build() -> tuple[ss.Run, nn.Module, torch.optim.Optimizer, object, object]:
        run, model, opt = _setup()
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        return run, model, opt, sched, scaler

    run, model, opt, sched, scaler = build()
    with run:
        run.resume(tmp_path, model=model, optimizer=opt, scheduler=sched, scaler=scaler)
        for _ in range(3):
            scaler.scale(model(torch.randn(2, 4)).sum()).backward()
            scaler.step(opt)
            scaler.update(new_scale=scaler.get_scale() * 2)
            sched.step()
        run.save()
    run, model, opt, sched2, scaler2 = build()
    with run:
        state = run.resume(tmp_path, model=model, optimizer=opt, scheduler=sched2, scaler=scaler2)
    assert state.step == 3  # counted through the scaler's optimizer steps
    assert sched2.get_last_lr() == sched.get_last_lr() == [0.1 * 0.5**3]
    assert scaler2.get_scale() == scaler.get_scale() == 2.0**13


def test_objects_without_state_dict_are_rejected(tmp_path: Path) -> None:
    run, model, _ = _setup()
    with run, pytest.raises(TypeError, match="notes=.*state_dict"):
        run.resume(tmp_path, model=model, notes=[1, 2])


def test_resume_refuses_a_path_that_is_a_regular_file(tmp_path: Path) -> None:
    target = tmp_path / "model.pt"
    target.write_bytes(b"not a checkpoint directory")
    run, model, opt = _setup()
    with run:
        with pytest.raises(CheckpointError, match=r"model\.pt.* is a regular file"):
            run.resume(target, model=model, optimizer=opt)
        # refused before anything started: a directory still works in the same run
        assert run.resume(tmp_path / "ck", model=model, optimizer=opt).step == 0
    assert target.read_bytes() == b"not a checkpoint directory"


def test_save_failure_says_the_disk_is_full_under_the_wrappers() -> None:
    from splitsync.ckpt.faults import describe_failure, is_disk_full

    # torch.save's zip writer hides ENOSPC in __context__
    try:
        try:
            raise OSError(28, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos") \
                from None
    except RuntimeError as e:
        zip_error = e
    zip_error.__context__ = OSError(28, "No space left on device")
    assert is_disk_full(zip_error)

    class CheckpointException(BaseException):  # DCP's: a BaseException, causes in failures
        def __init__(self, failures: dict) -> None:
            super().__init__("CheckpointException ranks:dict_keys([1])")
            self.failures = failures

    dcp = CheckpointException({1: (OSError(28, "No space left on device"), None)})
    msg = describe_failure(dcp, "rank 1 writing", "/ck/.tmp-step-000002", 12_600_000, 4096)
    assert "the disk is full" in msg and "12.6 MB to write" in msg and "0.0 MB free" in msg
    other = describe_failure(CheckpointException({0: (ValueError("bad"), None)}), "rank 0 "
                             "writing", "/ck", 0, 50 << 20)
    assert other.endswith("ValueError: bad") and "full" not in other
    # pickled across ranks, the zip writer's error has lost its ENOSPC: the free space says it
    assert "the disk is full" in describe_failure(RuntimeError("unexpected pos 704 vs 598"),
                                                  "rank 0 writing", "/ck", 10, 0)
