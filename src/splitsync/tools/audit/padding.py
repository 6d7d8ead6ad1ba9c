"""Which samples an epoch's padding repeated, against the ones DistributedSampler repeats.

With ``drop_last=False`` an indexable dataset the world size does not divide is padded: the
last positions of the ranks' passes repeat the epoch's first positions (position ``q`` past
the end is position ``q mod n``), whatever position the pass was resumed from. The ledger
records each rank's padded ids (the last ``padded`` ids of a step); counting them is not
enough, since a resume that padded with other samples pads as many. Here each rank's
padding is recomputed from the pass the ledger recorded (dataset length, seed, epoch,
shuffle, order, start, world size) and compared id by id. The epoch's order comes from
:class:`~splitsync.data.order.PassOrder` read whole (one rank, from position 0), where no
wrapping happens: the wrap itself is computed here, apart from the sampler's.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from splitsync.tools.audit.history import Entry, History

__all__ = ["expected_padding", "padding_problem"]


def expected_padding(info: dict[str, Any], rank: int) -> list[int]:
    """The ids DistributedSampler pads rank ``rank``'s pass with (the pass the ledger's P
    record ``info`` describes; none with ``drop_last``)."""
    from splitsync.data.order import PassOrder  # torch: only where padding is checked

    n, start, world = int(info["n"]), int(info.get("start", 0)), int(info["world_size"])
    rest = n - start
    if info.get("drop_last") or rest <= 0:
        return []
    per_rank = math.ceil(rest / world)
    real = len(range(rank, rest, world))
    if per_rank == real:
        return []
    whole = PassOrder(n, int(info["seed"]), int(info["epoch"]), bool(info["shuffle"]),
                      str(info.get("order", "bijection")), 0, 0, 1, n).indices(0, n).tolist()
    return [whole[(start + p * world + rank) % n] for p in range(real, per_rank)]


def _pass_of(history: History, launch: int, loader: int, epoch: int) -> dict[str, Any] | None:
    for ln in history.launches:
        if ln.number == launch:
            found = [p for p in ln.passes.get(loader, []) if int(p["epoch"]) == epoch]
            return found[-1] if found else None  # the pass that reached the epoch's end
    return None


def padding_problem(history: History, loader: int, epoch: int,
                    entries: list[Entry]) -> dict[str, Any] | None:
    """The first padded sample of a map-style epoch that is not DistributedSampler's, with
    who trained it and what it should have been; None when every one is."""
    got: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (launch, rank) -> (id, step)
    for e in sorted(entries, key=lambda e: e.record.step):
        r = e.record
        if r.padded:
            got.setdefault((e.launch, e.rank), []).extend(
                (int(i), r.step) for i in r.ids[len(r.ids) - r.padded:])
    for (launch, rank), ids in sorted(got.items()):
        info = _pass_of(history, launch, loader, epoch)
        if info is None or info.get("kind") != "map":
            continue
        want = expected_padding(info, rank)
        for k, (sample, step) in enumerate(ids):
            if k >= len(want) or sample != want[k]:
                what = (f"index {want[k]}" if k < len(want) else "no sample")
                return {"problem": f"used as padding where DistributedSampler pads with "
                                   f"{what} (the pass began at position "
                                   f"{int(info.get('start', 0))} of {int(info['n'])} on "
                                   f"{int(info['world_size'])} ranks)",
                        "sample": sample, "step": step, "rank": rank, "launch": launch}
    return None
