"""Does a line run on every rank? Shared by the rules about output and files written by
every process (SS501-SS505 and the rules on run folders and per-node writers).

A call runs on every rank of a distributed run unless a rank-0 check guards it, it is only
reached at world size 1, in the parent that launches the ranks, in a helper's own
self-test, in a Ray driver (the ranks are actors), or in a function the project never
reaches on every rank (:mod:`splitsync.check.reach`).
"""

from __future__ import annotations

import ast

from splitsync.check.evidence import launcher_functions, world_size_one
from splitsync.check.facts import Facts, last_name
from splitsync.check.flow import guarded_by_rank0, mentions_rank
from splitsync.check.ranks import rank_in
from splitsync.check.reach import runs_everywhere

__all__ = ["every_rank", "guard_text", "rank_derived", "names_rank", "outer_function"]

#: Calls whose value differs in every process: a path built from one names one file per
#: process (`str(datetime.now())` to the microsecond, `time.time()`, a uuid, a temp file).
_UNIQUE = frozenset({"getpid", "uuid1", "uuid4", "mkstemp", "mkdtemp", "NamedTemporaryFile",
                     "TemporaryDirectory", "time_ns", "perf_counter_ns"})
_CLOCKS = frozenset({"now", "time", "utcnow"})


def outer_function(facts: Facts, call: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The top-level function (or method) ``call`` is in, if any."""
    found = None
    for parent in facts.ancestors(call):
        if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef):
            found = parent
    return found


def _own_main_only(facts: Facts, call: ast.AST) -> bool:
    """Is ``call`` reached only from this module's own ``__main__`` block (directly, or in a
    function only that block calls)?"""
    main = facts.main_block()
    if main is None:
        return False
    if any(a is main for a in facts.ancestors(call)):
        return True
    outer = outer_function(facts, call)
    if outer is None:
        return False
    sites = [c for c, _ in facts.calls if last_name(c) == outer.name]
    return bool(sites) and all(any(a is main for a in facts.ancestors(c)) for c in sites)


def every_rank(facts: Facts, call: ast.Call) -> bool:
    """Does ``call`` run on every rank of a distributed script?"""
    if not facts.in_distributed_run or guarded_by_rank0(facts, call) \
            or world_size_one(facts, call):
        return False
    main = facts.main_block()
    if facts.uses_spawn and main is not None and any(a is main for a in facts.ancestors(call)):
        return False  # spawned children never run the parent's __main__ block
    scope = facts.scope(call)
    if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef) \
            and scope.name in launcher_functions(facts):
        return False  # the function that starts the ranks runs once, in the parent
    if not facts.is_distributed and facts.project.framework is None \
            and _own_main_only(facts, call):
        return False  # a helper module's self-test: runs when the file is run alone
    outer = outer_function(facts, call)
    if not facts.is_script and outer is not None and outer.name not in facts.project.called \
            and outer.name not in facts.loaded_names:
        return False  # a library function no module of the project calls: no evidence it runs
    if _ray_driver(facts, call):
        return False  # Ray runs the ranks as actors; the rest of the file is the one driver
    if under_lock(facts, call, once=True):
        return False  # one process, holding a file lock, finds the work still to do
    return runs_everywhere(facts, call)


def under_lock(facts: Facts, call: ast.AST, once: bool = False) -> bool:
    """Is ``call`` inside ``with FileLock(...):`` (processes take turns)? ``once``: and
    under a test that the work is still to do (``if not os.path.exists(path):``), so only
    the first process to hold the lock does it."""
    locked = checked = False
    for parent in facts.ancestors(call):
        if isinstance(parent, ast.If) and any(
                last_name(c) in {"exists", "isfile", "isdir"}
                for c in facts.inside(parent.test, ast.Call)):
            checked = True
        if isinstance(parent, ast.With | ast.AsyncWith) and any(
                "lock" in (facts.text(i.context_expr, 200)).lower() for i in parent.items):
            locked = True
            break
        if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef | ast.Module):
            break
    return locked and (checked or not once)


def _ray_remote(facts: Facts, node: ast.AST) -> bool:
    decorators = getattr(node, "decorator_list", [])
    return any(last_name(d) == "remote" and (facts.resolve(
        d.func if isinstance(d, ast.Call) else d) or "").startswith("ray") for d in decorators)


def _ray_driver(facts: Facts, call: ast.AST) -> bool:
    """Is ``call`` in the driver of a Ray program (outside every ``@ray.remote`` actor)?"""
    if "ray" not in facts.aliases.values():
        return False
    if not any(_ray_remote(facts, n) for n in facts.of(ast.ClassDef, ast.FunctionDef)):
        return False
    return not any(_ray_remote(facts, p) for p in facts.ancestors(call))


def guard_text(facts: Facts) -> str:
    """The rank-0 check to suggest in a fix."""
    if facts.is_splitsync:
        return "`if run.is_main:`"
    return "`if rank == 0:` (or `dist.get_rank() == 0`)"


def rank_derived(facts: Facts, scope: ast.AST, unique: bool = False) -> set[str]:
    """Names in ``scope`` computed from a rank (``device = f"cuda:{rank}"``) or from a value
    unique per process: a message or a path that shows one names its process."""
    names: set[str] = set()
    assigns: list[ast.Assign | ast.AnnAssign] = []
    loops: list[ast.For | ast.AsyncFor] = []
    withs: list[ast.withitem] = []
    for n in facts.walk_scope(scope):  # one walk for the three kinds
        if isinstance(n, ast.Assign | ast.AnnAssign):
            if n.value is not None:
                assigns.append(n)
        elif isinstance(n, ast.For | ast.AsyncFor):
            loops.append(n)
        elif isinstance(n, ast.withitem) and unique:
            withs.append(n)
    for node in assigns if unique else ():  # `stamp = str(datetime.now())`: one per process
        if _unique(facts, node.value):  # type: ignore[arg-type]
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    for item in withs:
        if isinstance(item.optional_vars, ast.Name) and _unique(facts, item.context_expr):
            names.add(item.optional_vars.id)  # `with NamedTemporaryFile() as tmp`
    for _ in range(3):  # `local = int(os.environ["LOCAL_RANK"])`, then `device = f"..{local}"`
        before = len(names)
        for loop in loops:  # `for path in files[rank::world]`: each rank its own items
            if rank_in(facts, loop.iter):
                names.update(t.id for t in ast.walk(loop.target) if isinstance(t, ast.Name))
        for node in assigns:
            if not _plain(facts, node.value):  # type: ignore[arg-type]
                continue  # `model = Net().to(device)` is no name for the process
            if rank_in(facts, node.value) or (names and any(
                    isinstance(n, ast.Name) and n.id in names
                    for n in facts.subtree(node.value))):  # type: ignore[arg-type]
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
        if len(names) == before:
            break
    return names


#: Calls that only convert or format a value: a name computed through them still shows it.
_CONVERSIONS = frozenset({"int", "str", "float", "format", "join", "get", "device", "getenv",
                          "environ", "Path", "zfill"})


def _plain(facts: Facts, expr: ast.AST) -> bool:
    """Is ``expr`` a value computed from its names by formatting or arithmetic only (so a
    name bound to it still says which process it is), not the result of other calls?"""
    return all(last_name(c) in _CONVERSIONS for c in facts.inside(expr, ast.Call))


def _unique(facts: Facts, expr: ast.AST) -> bool:
    """Does ``expr`` hold a value that differs in every process: a process id, a uuid, a temp
    file, or the clock read to below the second (``str(datetime.now())``, ``time.time()``;
    ``strftime("%Y%m%d-%H%M%S")`` is the same on processes started in the same second)?"""
    for node in facts.inside(expr, ast.Call):
        name = last_name(node)
        if name in _UNIQUE:
            return True
        if name in _CLOCKS:
            parent = facts.parents.get(node)
            if not (isinstance(parent, ast.Attribute) and parent.attr == "strftime"
                    and "%f" not in ast.unparse(facts.parents.get(parent, parent))):
                return True
    return False


def names_rank(facts: Facts, call: ast.Call, cache: dict[int, set[str]],
               unique: bool = False) -> bool:
    """Does ``call`` name its process: the rank, the process id, or a value derived from
    them in its arguments? ``unique``: a value unique per process counts too (a path
    stamped to the microsecond is one file per process; a message stamped so is not)."""
    parts = [*call.args, *call.keywords]
    if mentions_rank(parts, facts) or any(
            last_name(n) == "getpid" for p in parts for n in facts.subtree(p)) or (
            unique and any(_unique(facts, p) for p in parts)):
        return True  # the rank or the process id: the line says which process wrote it
    scope = facts.scope(call)
    if id(scope) not in cache:
        memo = facts.tree_index.memo  # the same scopes are asked by several rules
        key = f"rank_derived:{id(scope)}:{unique}"
        if key not in memo:
            memo[key] = rank_derived(facts, scope, unique)
        cache[id(scope)] = memo[key]  # type: ignore[assignment]
    derived = cache[id(scope)]
    return bool(derived) and any(isinstance(n, ast.Name) and n.id in derived
                                 for p in parts for n in facts.subtree(p))


