"""What a checkpoint directory holds, as plain data (``splitsync ckpt inspect``).

For each step: who wrote it (strategies, world size, torch), whether its manifest and
checksums verify, its files and sizes, and what it holds -- models, optimizers, schedulers,
scalers, EMA and any other registered object, loader positions, RNG states, extras. Contents
are read only from checkpoints whose every file verifies; sharded (DCP) tensors are described
from DCP's metadata, without reading them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from splitsync.ckpt.offline import reading as offline
from splitsync.ckpt.save import STATE_FILE, rank_file
from splitsync.ckpt.state import KINDS, kind_from_state
from splitsync.ckpt.store import MANIFEST
from splitsync.errors import CheckpointError

__all__ = ["summarize", "describe_step"]


def _tensors(obj: Any) -> Iterable[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, Mapping):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def _stats(sizes: Iterable[tuple[tuple[int, ...], torch.dtype]]) -> dict[str, Any]:
    """Tensor count, elements, bytes and dtypes of (shape, dtype) pairs."""
    n = elements = nbytes = 0
    dtypes: set[str] = set()
    for shape, dtype in sizes:
        count = 1
        for d in shape:
            count *= int(d)
        n, elements = n + 1, elements + count
        nbytes += count * dtype.itemsize
        dtypes.add(str(dtype).removeprefix("torch."))
    return {"tensors": n, "elements": elements, "bytes": nbytes, "dtypes": sorted(dtypes)}


def _of(obj: Any) -> dict[str, Any]:
    return _stats((tuple(t.shape), t.dtype) for t in _tensors(obj))


def _optimizer(osd: Mapping[str, Any], stats: dict[str, Any]) -> dict[str, Any]:
    state = osd.get("state", {})
    keys = sorted({k for s in state.values() if isinstance(s, Mapping) for k in s})
    groups = [g for g in osd.get("param_groups", []) if isinstance(g, Mapping)]
    return {**stats, "params_with_state": len(state), "state_keys": keys,
            "param_groups": len(groups),
            "lr": [g["lr"] for g in groups if isinstance(g.get("lr"), (int, float))]}


def _object_details(kind: str, state: Any) -> dict[str, Any]:
    """A few telling values of schedulers and scalers (plain numbers only)."""
    if not isinstance(state, Mapping):
        return {}
    wanted = {"scheduler": ("last_epoch", "_last_lr", "base_lrs"),
              "scaler": ("scale", "_growth_tracker", "growth_interval")}.get(kind, ())
    out = {}
    for key in wanted:
        v = state.get(key)
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            v = v.item()
        if isinstance(v, (int, float, list)) and not isinstance(v, bool):
            out[key.lstrip("_")] = v
    return out


def _sharded(loc: offline.Location, name: str, body: Mapping[str, Any]) -> tuple[dict, dict]:
    from splitsync.ckpt.offline.dcpread import metadata, read_keys, tensor_entries

    step_dir = offline.local_dir(loc, name)
    md = metadata(step_dir)

    def stats(prefix: tuple[str, ...]) -> dict[str, Any]:
        entries = tensor_entries(md, prefix)
        return _stats((tuple(m.size), m.properties.dtype) for m in entries.values())

    models = {m: stats(("model", m)) for m in body["models"]}
    optims = {}
    for o in body["optimizers"]:
        per_param: dict[str, dict[str, None]] = {}
        for path in tensor_entries(md, ("optim", o, "state")):  # (param name, state key)
            per_param.setdefault(str(path[0]), {})[str(path[-1])] = None
        groups = read_keys(step_dir, {f"optim.{o}.param_groups"})  # a few bytes
        osd = {"state": per_param,
               "param_groups": groups.get("optim", {}).get(o, {}).get("param_groups", [])}
        optims[o] = _optimizer(osd, stats(("optim", o)))
    return models, optims


def describe_step(loc: offline.Location, name: str, quick: bool = False) -> dict[str, Any]:
    """One checkpoint: its check, who wrote it, what it holds (when it verifies). ``quick``:
    the manifest and file sizes only; contents are named, not read."""
    c, loaded = offline.check(loc, name, load=(STATE_FILE, rank_file(0)), checksums=not quick)
    body = c.body
    status = "complete" if c.ok else "damaged"
    if body is None and c.problems[0].startswith(f"{MANIFEST} is missing"):
        status = "no manifest"
    entry = {"name": name, "where": loc.where(name), "status": status, "ok": c.ok,
             "problems": list(c.problems),
             "checksums": ("ok" if c.ok else "failed") if c.checksums else "not checked"}
    if body is None:
        return entry
    strategies = dict(body.get("strategies", {}))
    distinct = sorted(set(strategies.values()))
    files = {rel: int(info["size"]) for rel, info in sorted(body["files"].items())}
    entry.update({
        "step": body["step"], "epoch": body["epoch"], "world_size": body["world_size"],
        "strategy": distinct[0] if len(distinct) == 1 else ("mixed" if distinct else None),
        "strategies": strategies, "layout": body["layout"], "torch": body.get("torch"),
        "bytes": sum(files.values()), "files": files,
        "loaders": list(body.get("loaders", [])), "extra": dict(body.get("extra", {})),
        "rng": {"ranks": sum(1 for r in files if r.startswith("rank-") and r.endswith(".pt"))},
    })
    types, kinds = dict(body.get("types", {})), dict(body.get("kinds", {}))
    holds: dict[str, dict[str, Any]] = {k: {} for k in KINDS}
    if not (c.ok and c.checksums):  # names only: nothing is read from unverified files
        for m in body["models"]:
            holds[kinds.get(m, "model")][m] = {"type": types.get(m)}
        for o, owner in body["optimizers"].items():
            holds["optimizer"][o] = {"type": types.get(o), "model": owner}
        for o in body["objects"]:
            holds[kinds.get(o, "object")][o] = {"type": types.get(o)}
        entry["holds"] = holds
        return entry
    state = offline.state_of(loc, name, loaded)
    if body["layout"] == "sharded":
        models, optims = _sharded(loc, name, body)
    else:
        models = {m: _of(state["model"][m]) for m in body["models"]}
        optims = {o: _optimizer(state["optim"][o], _of(state["optim"][o]))
                  for o in body["optimizers"]}
    for m, stats in models.items():
        holds[kinds.get(m, "model")][m] = {"type": types.get(m), "strategy": strategies.get(m),
                                           **stats}
    for o, stats in optims.items():
        holds["optimizer"][o] = {"type": types.get(o), "model": body["optimizers"][o], **stats}
    for o in body["objects"]:
        st = state["objects"].get(o)
        kind = kinds.get(o) or kind_from_state(o, types.get(o), st)
        holds[kind][o] = {"type": types.get(o), **_of(st), **_object_details(kind, st)}
    entry["holds"] = holds
    entry["tensor_extra"] = {k: _of(v) for k, v in state.get("extra", {}).items()}
    ranks = loaded.get(rank_file(0))
    if isinstance(ranks, Mapping):
        entry["rng"]["kinds"] = sorted(ranks.get("rng", {}))
        entry["rng"]["loader_generators"] = sum(g is not None for g in ranks.get("generators", []))
    return entry


def summarize(path: str | os.PathLike[str], step: int | None = None,
              quick: bool = False) -> dict[str, Any]:
    """Every checkpoint at ``path`` (or only ``step``), newest first (``quick``: see
    :func:`describe_step`)."""
    loc = offline.locate(path)
    found = offline.entries(loc)
    if step is not None:
        found = [e for e in found if e.step == step]
        if not found:
            have = ", ".join(str(e.step) for e in offline.entries(loc)) or "none"
            raise CheckpointError(f"{loc.path}: there is no step {step} (steps: {have}).")
    steps = []
    for e in found:
        if e.status == "committed":
            steps.append(describe_step(loc, e.name, quick))
        else:
            steps.append({"name": e.name, "where": loc.where(e.name), "step": e.step,
                          "status": e.status, "ok": False, "checksums": "not checked",
                          "problems": []})
    return {"path": str(path), "latest": offline.read_latest(loc), "steps": steps}
