"""The plain data the checker passes around: severities, rules, hits and findings."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SEVERITIES", "Hit", "Rule", "Finding", "Project"]

#: From most to least serious; only errors make ``splitsync check`` exit 1 by default.
SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True)
class Hit:
    """What a rule function yields: where (an AST node), what is wrong and the fix."""

    node: ast.AST
    message: str
    fix: str
    #: Overrides the rule's severity for this hit (a finding that depends on unseen values).
    severity: str | None = None


@dataclass(frozen=True)
class Rule:
    """One check: a code such as ``SS101``, a default severity and the function that finds it."""

    code: str
    name: str
    severity: str
    summary: str
    explain: str
    # called with a file's Facts (check/facts.py, which builds on this module: not imported)
    check: Callable[[Any], Iterator[Hit]]

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"rule {self.code}: severity {self.severity!r} is not one of {SEVERITIES}")


@dataclass(frozen=True)
class Finding:
    """A located diagnostic, ready for a reporter."""

    code: str
    name: str
    severity: str
    message: str
    fix: str
    path: str
    line: int
    column: int
    end_line: int

    def as_dict(self) -> dict[str, object]:
        """JSON-ready form (1-based line and column)."""
        return {
            "code": self.code, "name": self.name, "severity": self.severity,
            "path": self.path, "line": self.line, "column": self.column,
            "end_line": self.end_line, "message": self.message, "fix": self.fix,
        }


@dataclass(frozen=True)
class Project:
    """What the script's own modules (the file and the local modules it imports, or that
    import it) do together: facts one file alone cannot show."""

    #: The files analysed together with this one (itself included).
    files: tuple[str, ...] = ()
    #: ``path<TAB>line<TAB>module`` of each import of a project module the checker could not
    #: read (not among the files given, not found beside them): rules do not claim what
    #: depends on it, and the report lists it once.
    unseen: frozenset[str] = frozenset()
    #: The names those imports bind (``init_distributed_mode``, ``utils``).
    unseen_names: frozenset[str] = frozenset()
    #: Some module replaces ``builtins.print`` (``setup_for_distributed(is_master)``).
    print_override: bool = False
    #: The last name of every call made anywhere in those files (``set_epoch``, ``no_sync``).
    called: frozenset[str] = frozenset()
    #: Every name and attribute the files mention (``require_backward_grad_sync``).
    mentioned: frozenset[str] = frozenset()
    #: Some module wraps a model for data-parallel training (DDP, FSDP, ``run.model``).
    wrapped: bool = False
    #: Some module is a distributed training script.
    distributed: bool = False
    #: A random seed is set with the same value on every rank (``torch.manual_seed(0)``).
    same_seed: bool = False
    #: Log output is limited to rank 0 (a per-rank level, a NullHandler off rank 0) or each
    #: record shows its rank (a Formatter that reads the rank).
    log_rank_limited: bool = False
    #: Some module makes INFO records visible (``basicConfig``, a handler, ``setLevel``).
    log_configured: bool = False
    #: ``"Fabric"`` or ``"Accelerator"``: a framework sets up the processes and the loaders.
    framework: str | None = None
    #: Some module splits the data between ranks (a DistributedSampler in the data helpers).
    sharded: bool = False
    #: Names called on every rank by code that runs on import (and root functions), and per
    #: function name the names it calls outside a rank-0 check (:mod:`splitsync.check.reach`).
    entry: frozenset[str] = frozenset()
    #: The names its `if __name__ == "__main__":` block calls (entries unless imported).
    main_entry: frozenset[str] = frozenset()
    edges: dict[str, frozenset[str]] = field(default_factory=dict, hash=False)
    #: Functions code outside the project may call (module-level functions, a library's
    #: public methods): entries when nothing in the project mentions them.
    outside: frozenset[str] = frozenset()
    #: A library module's public classes and methods: entries of a project without a script.
    api: frozenset[str] = frozenset()
    #: Some file of the project is a script (it runs; it is not only imported).
    has_script: bool = False
    #: Names the files mention that may refer to a function of the project.
    referenced: frozenset[str] = frozenset()
    #: ``stem:name`` of module-level functions that enter a collective (an MPI broadcast).
    collectives: frozenset[str] = frozenset()
    #: Some module sets up the process group on some paths only (``distributed = False``).
    optional_group: bool = False
    #: The function names the project reaches on every rank (None: not computed).
    reach: frozenset[str] | None = None
