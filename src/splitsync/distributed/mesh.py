"""The N-D device mesh of ``init(mesh=...)``: data-parallel replicate and shard, tensor-parallel.

``init(mesh={"dp_replicate": 1, "dp_shard": -1, "tp": 2})`` names three sizes whose product
is the world size (one of them may be -1: "the rest"). Ranks are laid out with ``tp``
innermost, so the ranks of a tensor-parallel group are neighbours (the processes of one
node, on the fast links), then ``dp_shard``, then ``dp_replicate``::

    rank = (replica * dp_shard + shard) * tp + tp_rank

The coordinates are pure arithmetic on the rank (:class:`MeshShape`), so every launcher's
ranks map the same way and can be tested without a process group; :func:`build_mesh` makes
the one ``DeviceMesh`` with those dimension names (and ``"dp"``, the two data-parallel
dimensions flattened) once the group exists.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["MESH_NAMES", "MeshShape", "mesh_shape", "build_mesh", "tp_spans_nodes",
           "replica_sum"]

#: The mesh's dimension names, outermost first (what scripts write in init(mesh=...)).
MESH_NAMES: tuple[str, ...] = ("dp_replicate", "dp_shard", "tp")


@dataclass(frozen=True)
class MeshShape:
    """The sizes of the mesh's dimensions and, from a rank, its coordinates."""

    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1

    @property
    def world_size(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp

    @property
    def dp_size(self) -> int:
        """Data-parallel replicas of the model: ranks that read different batches."""
        return self.dp_replicate * self.dp_shard

    @property
    def sizes(self) -> tuple[int, int, int]:
        return self.dp_replicate, self.dp_shard, self.tp

    def dp_rank(self, rank: int) -> int:
        """Which data-parallel replica ``rank`` belongs to (every rank of one TP group alike)."""
        return rank // self.tp

    def tp_rank(self, rank: int) -> int:
        """``rank``'s place inside its tensor-parallel group."""
        return rank % self.tp

    def as_dict(self) -> dict[str, int]:
        return dict(zip(MESH_NAMES, self.sizes, strict=True))


def _size(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != -1):
        raise ValueError(f"init(mesh=...): {name}={value!r}: give a number of ranks >= 1, or "
                         "-1 for the rest of the world size (at most one -1).")
    return value


def mesh_shape(mesh: Mapping[str, Any], world_size: int) -> MeshShape:
    """``init(mesh=...)`` checked against ``world_size``: the sizes, with -1 filled in.

    Names not given are 1. Refuses unknown names (naming the nearest), more than one -1, and
    sizes whose product is not the world size, with the numbers.
    """
    if not isinstance(mesh, Mapping):
        raise TypeError(f"init(mesh={mesh!r}): give a dict of sizes, e.g. "
                        "mesh={'dp_replicate': 1, 'dp_shard': -1, 'tp': 2}.")
    unknown = [k for k in mesh if k not in MESH_NAMES]
    if unknown:
        import difflib

        close = difflib.get_close_matches(str(unknown[0]), MESH_NAMES, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"init(mesh=...): unknown dimension {unknown[0]!r}; the mesh's "
                         f"dimensions are {', '.join(MESH_NAMES)}.{hint}")
    sizes = {name: _size(name, mesh.get(name, 1)) for name in MESH_NAMES}
    rest = [n for n, v in sizes.items() if v == -1]
    if len(rest) > 1:
        raise ValueError(f"init(mesh=...): {' and '.join(rest)} are both -1; at most one "
                         "dimension can take the rest of the world size.")
    known = 1
    for v in sizes.values():
        if v != -1:
            known *= v
    if rest:
        if world_size % known:
            given = " x ".join(f"{n}={v}" for n, v in sizes.items() if v != -1)
            raise ValueError(
                f"init(mesh=...): {given} = {known} ranks does not divide the world size "
                f"{world_size}, so {rest[0]}=-1 has no whole size; launch a multiple of "
                f"{known} processes or change the sizes.")
        sizes[rest[0]] = world_size // known
    elif known != world_size:
        given = " x ".join(f"{n}={v}" for n, v in sizes.items())
        raise ValueError(
            f"init(mesh=...): {given} = {known} ranks, but the world size is {world_size}; "
            "the sizes must multiply to the world size (give one of them as -1 for the "
            "rest).")
    return MeshShape(sizes["dp_replicate"], sizes["dp_shard"], sizes["tp"])


def tp_spans_nodes(shape: MeshShape, local_world_size: int) -> bool:
    """Whether a tensor-parallel group would span nodes (``tp`` does not divide the processes
    of one node): its all-reduces, one per layer, would cross the slow links."""
    return shape.tp > 1 and local_world_size % shape.tp != 0


def replica_sum(reduce: Callable[..., Any], tp_size: int, value: float) -> Any:
    """The sum of ``value`` over the data-parallel replicas, each TP group's ranks holding
    the same one: ``reduce``'s sum over all ranks, divided by the TP size."""
    total = reduce(value, op="sum")
    return total / tp_size if tp_size > 1 else total


def build_mesh(shape: MeshShape, device_type: str) -> Any:
    """The job's ``DeviceMesh`` (a collective: every rank calls it), dimensions named
    :data:`MESH_NAMES`, plus ``"dp"``: dp_replicate and dp_shard flattened into one."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device_type, shape.sizes, mesh_dim_names=MESH_NAMES)
    mesh[("dp_replicate", "dp_shard")]._flatten("dp")
    return mesh
