"""Rank-consistency guards: same arguments and configuration at init, same initial weights."""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from splitsync.errors import ConfigMismatchError, ParameterMismatchError
from splitsync.run.config import RunConfig

__all__ = [
    "ConfigMismatchError",
    "ParameterMismatchError",
    "config_summary",
    "check_same_config",
    "param_fingerprints",
    "check_same_parameters",
    "reference_ranks",
]

# Per-rank by nature: a device pinned to the local GPU, and the legacy launcher's flag.
_PER_RANK_FIELDS = {"device"}
_LOCAL_RANK_ARG = re.compile(r"^--local[-_]rank(=.*)?$")
_MOD = (1 << 61) - 1  # Mersenne prime: fingerprints stay exact in int64
_CHUNK = 1 << 20


def config_summary(config: RunConfig, argv: Sequence[str]) -> dict[str, str]:
    """What must agree on every rank: the script's arguments and the run's settings."""
    args = [a for a in argv[1:] if not _LOCAL_RANK_ARG.match(a)]
    out = {"script": str(argv[0]) if argv else "", "number of arguments": str(len(args))}
    out.update({f"argument {i + 1}": a for i, a in enumerate(args)})
    for name, value in config.settings():
        if name not in _PER_RANK_FIELDS:
            out[f"init({name}=...)"] = repr(value)
    return out


def _digest(summary: dict[str, str]) -> int:
    raw = hashlib.sha256(json.dumps(summary, sort_keys=True).encode()).digest()
    return int.from_bytes(raw[:8], "little", signed=True)


def _gather_int(value: int, device: torch.device, group: dist.ProcessGroup | None) -> list[int]:
    t = torch.tensor([value], dtype=torch.int64, device=device)
    parts = [torch.zeros_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t, group=group)
    return [int(p.item()) for p in parts]


def reference_ranks(values: Sequence[object]) -> set[int]:
    """Ranks holding the most common value (ties: the group that contains rank 0)."""
    counts = Counter(values)
    best = max(counts.values())
    winners = [v for v, c in counts.items() if c == best]
    ref = values[0] if values[0] in winners else winners[0]
    return {r for r, v in enumerate(values) if v == ref}


def check_same_config(config: RunConfig, argv: Sequence[str], device: torch.device,
                      group: dist.ProcessGroup | None = None) -> None:
    """One hash all-gather; on a mismatch, name each differing rank and setting."""
    summary = config_summary(config, argv)
    hashes = _gather_int(_digest(summary), device, group)
    if len(set(hashes)) == 1:
        return
    everyone: list[dict[str, str] | None] = [None] * len(hashes)
    dist.all_gather_object(everyone, summary, group=group)  # in-job data, same job's ranks
    ref = reference_ranks(hashes)
    r0 = min(ref)
    lines = []
    for rank, other in enumerate(everyone):
        if rank in ref or other is None:
            continue
        base = everyone[r0] or {}
        for key in sorted(set(base) | set(other), key=lambda k: (not k.startswith("arg"), k)):
            if base.get(key) != other.get(key):
                lines.append(f"  rank {rank}: {key} = {other.get(key, '<missing>')!r}"
                             f"   (rank {r0}: {base.get(key, '<missing>')!r})")
    raise ConfigMismatchError(
        "The ranks were started with different arguments or splitsync settings:\n"
        + "\n".join(lines)
        + "\nEvery rank must run the same command and call splitsync.init(...) with the same "
        "values. Launch all ranks with one command (splitsync run -n N script.py ...), and do "
        "not derive settings from the rank."
    )


def _tensor_fingerprint(t: torch.Tensor) -> torch.Tensor:
    """Exact, order-sensitive hash of a tensor's bytes, computed on its own device."""
    flat = t.detach().contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    raw = flat.view(torch.uint8) if flat.numel() else flat.to(torch.uint8)
    acc = torch.zeros((), dtype=torch.int64, device=raw.device)
    for start in range(0, raw.numel(), _CHUNK):
        chunk = raw[start:start + _CHUNK].to(torch.int64)
        pos = torch.arange(start, start + chunk.numel(), dtype=torch.int64, device=raw.device)
        weight = (pos * 1000003 + 12345) % 2147483647 + 1  # < 2**31, so products stay < 2**39
        acc = (acc + (chunk * weight).sum() % _MOD) % _MOD
    return (acc + raw.numel()) % _MOD


def param_fingerprints(module: nn.Module) -> tuple[list[str], torch.Tensor]:
    """Names and one exact fingerprint per parameter (int64, on the parameters' device)."""
    names, values = [], []
    for name, p in module.named_parameters():
        names.append(name)
        values.append(_tensor_fingerprint(p))
    if not values:
        return names, torch.zeros(0, dtype=torch.int64)
    return names, torch.stack([v.to(values[0].device) for v in values])


def check_same_parameters(module: nn.Module, device: torch.device,
                          group: dist.ProcessGroup | None = None) -> None:
    """One all-reduce (max of [f, -f]) tells whether any parameter differs between ranks."""
    names, fp = param_fingerprints(module)
    if not names:
        return
    fp = fp.to(device)
    both = torch.cat([fp, -fp])
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
    n = len(names)
    differ = (both[:n] != -both[n:]).nonzero()
    if differ.numel() == 0:
        return
    first = int(differ[0].item())
    per_rank: list[list[int] | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(per_rank, fp.tolist(), group=group)  # rare path: name the ranks
    values = [v[first] if v is not None else None for v in per_rank]
    ref = reference_ranks(values)
    others = sorted(set(range(len(values))) - ref)
    shape = tuple(dict(module.named_parameters())[names[first]].shape)
    raise ParameterMismatchError(
        f"The ranks hold different initial parameters: first differing parameter "
        f"{names[first]!r} (shape {shape}, {differ.numel()} of {n} parameters differ); "
        f"rank(s) {others} differ from rank(s) {sorted(ref)}. "
        "Training would start from different models (or silently from rank 0's under DDP). "
        "Give every rank the same seed: splitsync.init(seed=0) (not a seed derived from the "
        "rank), and create the model after init(); or load the same checkpoint on all ranks."
    )
