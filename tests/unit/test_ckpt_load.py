"""Loading unsharded checkpoints: the optimizer state a resume replaces is freed on a thread,
and only when nothing else holds it."""

from __future__ import annotations

import time
import weakref
from pathlib import Path

import pytest
import torch
from torch import nn

import splitsync as ss
from splitsync.ckpt.load import free_later, held_state


def _trained() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Linear(16, 8)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(4, 16)).square().mean().backward()
    opt.step()
    return model, opt


def _one_step_saved(run: ss.Run, root: Path) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A Linear and its AdamW under ``run``, one step trained and saved under ``root``."""
    model = run.model(nn.Linear(16, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    run.resume(root, model=model, optimizer=opt)
    run.backward(model(torch.randn(4, 16)).square().mean())
    run.step(opt)
    run.save(root)
    return model, opt


def _dead(ref: weakref.ref, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while ref() is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    return ref() is None


def test_free_later_drops_copies_never_the_live_state() -> None:
    _, opt = _trained()
    before = {p: {k: v.clone() for k, v in st.items()} for p, st in opt.state.items()}
    free_later([held_state(opt)]).finish()
    assert opt.state.keys() == before.keys()
    for p, st in before.items():  # the optimizer still holds all of it, unchanged
        assert st.keys() == opt.state[p].keys()
        assert all(torch.equal(v, opt.state[p][k]) for k, v in st.items())


def test_a_resume_frees_the_optimizer_state_it_replaces(tmp_path: Path) -> None:
    with ss.init(seed=0) as run:
        torch.manual_seed(0)
        model, opt = _one_step_saved(run, tmp_path)
        saved = {n: opt.state[p]["exp_avg"].clone() for n, p in model.named_parameters()}
        run.backward(model(torch.randn(4, 16)).square().mean())
        run.step(opt)
        old = weakref.ref(opt.state[model.weight]["exp_avg"])
        assert run.resume(tmp_path, model=model, optimizer=opt).step == 1
        for n, p in model.named_parameters():  # the loaded state, not the replaced one
            assert torch.equal(opt.state[p]["exp_avg"], saved[n])
        assert _dead(old), "the replaced optimizer state is still alive"


class _Shrinks(torch.optim.SGD):
    """An optimizer whose step moves the weights whatever its lr (a decay not scaled by lr)
    and counts its steps."""

    def __init__(self, params: object) -> None:
        super().__init__(params, lr=0.1)  # type: ignore[arg-type]
        self.steps = 0

    @torch.no_grad()
    def step(self, closure: object = None) -> None:  # type: ignore[override]
        self.steps += 1
        for g in self.param_groups:
            for p in g["params"]:
                p.mul_(0.5)
                if p.grad is not None:
                    p.add_(p.grad, alpha=-g["lr"])
                    self.state[p]["seen"] = self.state[p].get("seen", 0) + 1


def test_a_resume_into_a_fresh_optimizer_does_not_step_it(tmp_path: Path) -> None:
    """DCP would step a stateless optimizer once (zero gradients, lr 0) before loading into
    it: wasted work (most of a large AdamW resume), and here it would halve the weights just
    loaded, so the resumed run would not continue the saved one."""
    with ss.init(seed=0) as run:
        torch.manual_seed(0)
        model = run.model(nn.Linear(16, 8))
        opt = _Shrinks(model.parameters())
        run.resume(tmp_path, model=model, optimizer=opt)
        run.backward(model(torch.randn(4, 16)).square().mean())
        run.step(opt)
        run.save(tmp_path)
        saved = {n: p.detach().clone() for n, p in model.named_parameters()}
    with ss.init(seed=0) as run:
        model = run.model(nn.Linear(16, 8))
        opt = _Shrinks(model.parameters())
        assert run.resume(tmp_path, model=model, optimizer=opt).step == 1
        assert opt.steps == 0
        for n, p in model.named_parameters():
            assert torch.equal(p, saved[n]), n
            assert opt.state[p] == {"seen": 1}


def _mapped_from(root: Path) -> list[tuple[int, int]]:
    """The address ranges of this process mapped from files under ``root``."""
    spans = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith(str(root)):
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            spans.append((lo, hi))
    return spans


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/self/maps")
def test_a_resumed_optimizer_owns_its_state_and_the_model_is_copied(tmp_path: Path) -> None:
    """The optimizer writes its state at every step: left mapped from the checkpoint, each of
    its pages would fault and be copied at the first step after the resume. Its tensors are
    the process's own; the model's were copied into the parameters."""
    with ss.init(seed=0) as run:
        _one_step_saved(run, tmp_path)
    with ss.init(seed=0) as run:
        model = run.model(nn.Linear(16, 8))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        assert run.resume(tmp_path, model=model, optimizer=opt).resumed
        spans = _mapped_from(tmp_path.resolve())
        tensors = [v for st in opt.state.values() for v in st.values()
                   if isinstance(v, torch.Tensor) and v.numel() > 1]
        tensors += list(model.parameters())
        assert tensors
        for t in tensors:
            ptr = t.data_ptr()
            assert not any(lo <= ptr < hi for lo, hi in spans), \
                "a tensor still lives in a mapping of the checkpoint file"
        run.backward(model(torch.randn(4, 16)).square().mean())
        run.step(opt)  # and it trains on from there
