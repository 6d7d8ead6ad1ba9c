"""Activation checkpointing in one process: same training, fewer saved bytes, clear errors."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import splitsync as ss
from splitsync.train.actckpt import apply_activation_checkpointing, is_checkpointed


class Block(nn.Module):
    """A residual MLP block, with dropout so that recomputation must replay the RNG."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.fc2(torch.nn.functional.gelu(self.fc1(x))))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Linear(8, 32)
        self.blocks = nn.Sequential(*(Block() for _ in range(4)))
        self.head = nn.Linear(32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


def saved_bytes(model: nn.Module, x: torch.Tensor) -> int:
    """Bytes autograd saves for backward in one forward, less the parameters themselves."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: set[int] = set()
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        storage = t.untyped_storage()
        if storage.data_ptr() not in params and storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(x).pow(2).mean()
    loss.backward()
    return total


def _train(spec: object, steps: int = 5, **model_kwargs: object) -> tuple[torch.Tensor, int]:
    g = torch.Generator().manual_seed(1)
    xs, ys = torch.randn(steps, 16, 8, generator=g), torch.randn(steps, 16, 2, generator=g)
    with ss.init(seed=0) as run:
        model = run.model(Net(), activation_checkpointing=spec, **model_kwargs)
        saved = saved_bytes(model, xs[0])
        model.zero_grad(set_to_none=True)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for x, y in zip(xs, ys, strict=True):
            run.backward(nn.functional.mse_loss(model(x), y))
            run.step(opt)
        return torch.cat([p.detach().flatten() for p in model.parameters()]), saved


def test_checkpointing_trains_identically_and_saves_less() -> None:
    plain, plain_saved = _train(None)
    for spec in (True, Block, (Block, nn.LayerNorm), lambda m: isinstance(m, Block)):
        params, saved = _train(spec)
        assert (params - plain).abs().max().item() <= 1e-6, spec  # dropout replayed too
        assert saved <= 0.6 * plain_saved, (spec, saved, plain_saved)


def test_checkpointing_composes_with_compile() -> None:
    plain, _ = _train(None, steps=2)
    params, _ = _train(True, steps=2, compile={"backend": "aot_eager"})
    assert (params - plain).abs().max().item() <= 1e-6


def test_selection_keeps_names_and_survives_deepcopy() -> None:
    net = Net()
    keys = list(net.state_dict())
    chosen = apply_activation_checkpointing(net, lambda m: isinstance(m, (Block, nn.Linear)),
                                            lambda: [])
    assert chosen == [net.stem, *net.blocks, net.head]  # outermost matches only
    assert not is_checkpointed(net.blocks[0].fc1) and is_checkpointed(net.blocks[0])
    assert list(net.state_dict()) == keys  # checkpoints and optimizers see the same names
    twin = copy.deepcopy(net)
    assert twin.blocks[0].forward.__self__ is twin.blocks[0]  # not the original's forward
    with torch.no_grad():
        twin.head.bias.add_(1.0)
    x = torch.randn(3, 8)
    net.eval(), twin.eval()
    assert torch.allclose(twin(x), net(x) + 1.0)
    # applying twice (run.model on the same module again) checkpoints once, not nested
    first = net.blocks[0].forward
    apply_activation_checkpointing(net, Block, lambda: [])
    assert net.blocks[0].forward == first


def test_bad_selections_name_the_types_present() -> None:
    with ss.init(seed=0) as run:
        with pytest.raises(ValueError, match=r"Conv2d matches no submodule of Net; its "
                           r"submodule types are \['Linear', 'Sequential', 'Block', "
                           r"'Dropout'\]"):
            run.model(Net(), activation_checkpointing=nn.Conv2d)
        with pytest.raises(ValueError, match="matches no submodule of Net"):
            run.model(Net(), activation_checkpointing=lambda m: False)
        with pytest.raises(ValueError, match="no repeated blocks.*activation_checkpointing=Block"):
            run.model(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), activation_checkpointing=True)
        with pytest.raises(TypeError, match="nn.Module subclasses"):
            run.model(Net(), activation_checkpointing=(Block, int))
        with pytest.raises(TypeError, match="predicate fn"):
            run.model(Net(), activation_checkpointing="Block")


def _shallow_replica(module: nn.Module) -> nn.Module:
    """What DataParallel's replicate makes of each module: a shallow copy of its __dict__."""
    replica = module._replicate_for_data_parallel()
    replica._modules = {k: _shallow_replica(v) for k, v in module._modules.items()}
    return replica


def test_data_parallel_replicas_run_their_own_checkpointed_forward() -> None:
    from splitsync.train.actckpt import has_bound_forwards, rebind_forwards

    net = Net()
    assert not has_bound_forwards(net)
    apply_activation_checkpointing(net, Block, lambda: [])
    assert has_bound_forwards(net)
    replica = _shallow_replica(net)
    assert replica.blocks[1].forward.__self__ is net.blocks[1]  # copied, still the original's
    rebind_forwards(net, replica)
    assert replica.blocks[1].forward.__self__ is replica.blocks[1]
    assert net.blocks[1].forward.__self__ is net.blocks[1]


def test_true_checkpoints_the_blocks_the_strategy_shards() -> None:
    from splitsync.strategies import get_strategy

    net = Net()
    assert get_strategy("ddp").blocks(net, {}) == list(net.blocks)  # the repeated Block
    assert get_strategy("hsdp").blocks(net, {}) == list(net.blocks)
    linears = get_strategy("fsdp").blocks(net, {"blocks": [nn.Linear]})  # FSDP's blocks=
    assert linears == [m for m in net.modules() if isinstance(m, nn.Linear)]
    with ss.init(seed=0) as run:
        model = run.model(Net(), strategy="single", activation_checkpointing=True)
        assert [is_checkpointed(m) for m in model.blocks] == [True] * 4
        assert not is_checkpointed(model.stem) and not is_checkpointed(model.blocks[0].fc1)
