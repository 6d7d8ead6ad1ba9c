"""Porting a script: misspelt keywords, run.generator, accumulation from the world size,
run.step's argument order and the resume line, at one process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import IterableDataset, TensorDataset

import splitsync as ss
from splitsync.data.build import ResumableLoader


def test_misspelt_init_keyword_names_the_nearest() -> None:
    with pytest.raises(TypeError, match=r"'precison'.*[Dd]id you mean `precision`\?"):
        ss.init(seed=0, precison="bf16-mixed")
    with pytest.raises(TypeError, match=r"[Dd]id you mean `find_unused_parameters`\?"):
        ss.init(seed=0, find_unsused_parameters=True)
    with pytest.raises(TypeError, match=r"strategy 'single' does not take"):
        ss.init(seed=0, strategy="single", find_unused_parameters=True)
    with pytest.raises(ValueError, match=r"Unknown strategy 'ddpp'.*Did you mean 'ddp'\?"):
        ss.init(seed=0, strategy="ddpp")


def test_misspelt_model_keyword_fails_under_auto_at_one_process() -> None:
    with ss.init(seed=0, guards=False) as run:
        with pytest.raises(TypeError, match=r"run\.model\(\).*`find_unused_parameters`"):
            run.model(nn.Linear(2, 2), find_unsused_parameters=True)
        with pytest.raises(TypeError, match=r"[Dd]id you mean `sync_batchnorm`\?"):
            run.model(nn.Linear(2, 2), sync_batchnorn=True)
        with pytest.raises(TypeError, match=r"strategy 'fsdp' does not take"):
            run.model(nn.Linear(2, 2), strategy="fsdp", static_graph=True)
        # DDP's real options are still accepted (and ignored) by "auto" at one process
        assert isinstance(run.model(nn.Linear(2, 2), find_unused_parameters=True), nn.Linear)


def test_accumulate_from_the_world_size() -> None:
    seen: list[int] = []

    def per_process(world_size: int) -> int:
        seen.append(world_size)
        return 4 // world_size

    with ss.init(seed=0, guards=False, accumulate=per_process) as run:
        assert run.config.accumulate == 4 and seen == [1]
        model = run.model(nn.Linear(2, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(4):
            run.backward(model(torch.ones(1, 2)).sum())
            run.step(opt)
            assert run.sync_gradients == (i == 3)  # one optimizer step per 4 micro-batches
    with pytest.raises(ValueError, match=r"returned 0 at world size 1"):
        ss.init(seed=0, accumulate=lambda world_size: 0)


def test_step_takes_the_optimizer_first() -> None:
    with ss.init(seed=0, guards=False) as run:
        model = run.model(nn.Linear(2, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        run.backward(model(torch.ones(1, 2)).sum())
        with pytest.raises(TypeError, match=r"run\.step\(optimizer, clip=None\) takes the "
                                            r"optimizer first, got a float"):
            run.step(1.0, opt)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="clip"):
            run.step(opt, opt)  # type: ignore[arg-type]
        assert run.step(opt, clip=1.0) is not None
        assert "Parameters, in this order" in (ss.Run.step.__doc__ or "")


def _draw(g: torch.Generator) -> list[int]:
    return torch.randint(0, 1 << 30, (4,), generator=g).tolist()


def test_generator_is_saved_and_restored(tmp_path: Path, capfd: pytest.CaptureFixture[str]
                                         ) -> None:
    ck = tmp_path / "ck"
    with ss.init(seed=7, guards=False) as run:
        mine, shared = run.generator(), run.generator(per_rank=False)
        assert run.generator() is mine and run.generator(name="rank") is mine
        assert _draw(mine) != _draw(shared)  # per rank and shared are different streams
        with pytest.raises(ValueError, match="per_rank=True"):
            run.generator(per_rank=False, name="rank")
        model = run.model(nn.Linear(2, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        run.resume(ck, model=model, optimizer=opt)
        run.backward(model(torch.ones(1, 2)).sum())
        run.step(opt)
        run.save(epoch=3)
        expected = (_draw(mine), _draw(shared), _draw(run.generator(name="late")))
    with ss.init(seed=7, guards=False) as run:
        mine = run.generator()  # made before resume: set by it
        fresh = _draw(run.generator(name="unsaved"))
        model = run.model(nn.Linear(2, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        capfd.readouterr()
        state = run.resume(ck, model=model, optimizer=opt)
        err = capfd.readouterr().err
        assert f"resumed from {state.path} at epoch 3, step 1" in err
        shared = run.generator(per_rank=False)  # made after resume: starts from its state
        assert (_draw(mine), _draw(shared)) == expected[:2]
        # not in the checkpoint (made after the save): starts from its seed, as it did then
        assert _draw(run.generator(name="late")) == expected[2]
        assert _draw(run.generator(name="unsaved")) != fresh  # untouched: it went on


class _Stream(IterableDataset):
    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(torch.arange(10.0))


def test_both_loaders_follow_one_protocol() -> None:
    with ss.init(seed=0, guards=False) as run:
        indexed = run.loader(TensorDataset(torch.arange(10.0)), batch_size=3, shuffle=True)
        stream = run.loader(_Stream(), batch_size=3)
        for loader, length in ((indexed, 4), (stream, None)):
            assert isinstance(loader, ResumableLoader) and loader.length == length
            it = iter(loader)
            first = next(it)
            pos, rng = loader.position(), loader.rng_state()
            rest = list(it)
            loader.restore(pos, rng)
            again = list(loader)
            flat = [(b if isinstance(b, torch.Tensor) else b[0]).tolist() for b in again]
            assert flat == [(b if isinstance(b, torch.Tensor) else b[0]).tolist() for b in rest]
            assert len(rest) == 3  # 10 samples in batches of 3: 4 batches in all
            assert run._data.active is loader and first is not None
        with pytest.raises(ValueError, match="stream loader's position"):
            indexed.restore(stream.position())
        with pytest.raises(ValueError, match="indexed loader's position"):
            stream.restore(indexed.position())
