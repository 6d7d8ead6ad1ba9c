"""Read many files on several cores: worker processes parse, index and check the files, this
process follows the imports and joins each file to its project.

A file is read by one worker, which keeps its facts; the worker sends back what the project
needs (the file's imports and its :class:`Project` part), this process merges the parts as
:func:`splitsync.check.analysis.projects_of` does for one process, and the worker runs
the rules on its files with their projects. Findings are the same as read in one process.

Workers are ``python -m splitsync.check.worker`` over pipes: a fresh interpreter (never a
fork of a caller that may hold threads or torch), and nothing but plain data crosses the pipes
(``marshal``: strings, numbers, lists, dicts and sets; never objects or code).
"""

from __future__ import annotations

import importlib
import marshal
import os
import selectors
import subprocess
import sys
from collections import deque
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, NoReturn

from splitsync.check.analysis import Parsed, importers_in, load, projects_of
from splitsync.check.facts import Facts
from splitsync.check.model import Finding, Project, Rule
from splitsync.check.project import Disk, with_project
from splitsync.check.reading import run_rules
from splitsync.check.registry import all_rules

__all__ = ["portable", "Pool", "analyse_in_pool", "worker_main"]

#: Requests kept queued at each worker, so it never waits for the next file.
_AHEAD = 4


def portable(rules: tuple[Rule, ...]) -> bool:
    """Can a worker rebuild ``rules`` from their codes and severities (registry rules, at
    any severity)? Rules made elsewhere (a test's own function) stay in this process."""
    known = {r.code: r for r in all_rules(gated=False)}
    return all(r.code in known and replace(known[r.code], severity=r.severity) == r
               for r in rules)


def _project_data(project: Project) -> dict[str, Any]:
    return {f.name: getattr(project, f.name) for f in fields(project)}


def _project(data: dict[str, Any]) -> Project:
    return Project(**data)


def _frame(message: dict[str, Any]) -> bytes:
    """One message: its length, then its ``marshal`` form (plain data only: str, int, bool,
    None, tuples, lists, dicts and frozensets; a string used many times is written once)."""
    body = marshal.dumps(message)
    return len(body).to_bytes(8, "little") + body


def _unframe(buffer: bytearray) -> dict[str, Any] | None:
    """The first whole message in ``buffer`` (removed from it), or None."""
    if len(buffer) < 8:
        return None
    size = int.from_bytes(buffer[:8], "little")
    if len(buffer) < 8 + size:
        return None
    message = marshal.loads(bytes(buffer[8:8 + size]))
    del buffer[:8 + size]
    return message


class Pool:
    """Readers for one check run: ``workers - 1`` worker processes, and this process, which
    reads files too between handing out work (closed by :meth:`close`). Workers are numbered
    ``0 .. count - 1``; the last is this process."""

    def __init__(self, workers: int) -> None:
        package = str(Path(__file__).resolve().parents[2])  # the folder holding `splitsync`
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (package, os.environ.get("PYTHONPATH", "")) if p)}
        self.procs = [subprocess.Popen(
            [sys.executable, "-m", "splitsync.check.worker"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, env=env) for _ in range(workers - 1)]
        self.count = len(self.procs) + 1
        self.local = _Worker()
        self.selector = selectors.DefaultSelector()
        self.buffers = [bytearray() for _ in self.procs]
        self.waiting: list[deque[dict[str, Any]]] = [deque() for _ in range(self.count)]
        for i, proc in enumerate(self.procs):
            self.selector.register(proc.stdout, selectors.EVENT_READ, i)  # type: ignore[arg-type]

    def send(self, worker: int, request: dict[str, Any]) -> None:
        """Queue ``request`` at ``worker`` (answered in the order sent)."""
        if worker < len(self.procs):
            stdin = self.procs[worker].stdin
            stdin.write(_frame(request))  # type: ignore[union-attr]
            stdin.flush()  # type: ignore[union-attr]
        self.waiting[worker].append(request)

    def busy(self, worker: int) -> int:
        """How many requests ``worker`` has not answered yet."""
        return len(self.waiting[worker])

    def answers(self) -> list[tuple[int, dict[str, Any], dict[str, Any]]]:
        """Wait for at least one answer: (worker, request, answer) for each that came. This
        process answers one of its own requests per call, after taking what the worker
        processes sent, so that they never wait long for more work."""
        came: list[tuple[int, dict[str, Any], dict[str, Any]]] = []
        mine = self.waiting[-1]
        while not came:
            for handle, _ in self.selector.select(0 if mine else None):
                worker = handle.data
                chunk = os.read(self.procs[worker].stdout.fileno(), 1 << 20)  # type: ignore[union-attr]
                if not chunk:
                    raise RuntimeError(f"splitsync check: worker {worker} exited (status "
                                       f"{self.procs[worker].wait()}) before answering; run "
                                       "with jobs=1 to read the files in one process")
                buffer = self.buffers[worker]
                buffer += chunk
                while (answer := _unframe(buffer)) is not None:
                    if "error" in answer:
                        raise RuntimeError(f"splitsync check: a worker failed: {answer['error']}")
                    came.append((worker, self.waiting[worker].popleft(), answer))
            if mine:
                request = mine.popleft()
                came.append((self.count - 1, request, self.local.answer(request)))
        return came

    def close(self) -> None:
        """End the workers (they exit when their input closes)."""
        self.selector.close()
        for proc in self.procs:
            if proc.stdin is not None:
                proc.stdin.close()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


def analyse_in_pool(files: list[Path], rules: tuple[Rule, ...], workers: int,
                    disk: Disk) -> dict[Path, list[Finding]]:
    """What ``analysis.analyse(files, rules, importers_beside(files))`` returns, read by
    ``workers`` processes."""
    pool = Pool(workers)
    try:
        return _drive(pool, files, rules, disk)
    finally:
        pool.close()


def _drive(pool: Pool, files: list[Path], rules: tuple[Rule, ...],
           disk: Disk) -> dict[Path, list[Finding]]:
    count = pool.count
    named = sorted(str(disk.resolve(f)) for f in files)
    folders = list(dict.fromkeys(disk.resolve(f).parent for f in files))
    for worker in range(count):  # with this process's import path: what counts as installed
        pool.send(worker, {"op": "named", "named": named, "path": list(sys.path)})
    for i, folder in enumerate(folders):  # the scripts beside the named files, per folder
        pool.send(i % count, {"op": "beside", "folder": str(folder)})
    run = _Loads(pool, {disk.resolve(f): f for f in files})
    context: dict[int, list[Path]] = {}
    parsed: dict[Path, int] = {}  # which worker parsed a sibling already
    while len(context) < len(folders) or run.pending():
        run.dispatch()
        for worker, request, answer in pool.answers():
            if request["op"] == "beside":
                context[folders.index(Path(request["folder"]))] = [
                    Path(p) for p in answer["importers"]]
                parsed.update((Path(p), worker) for p in answer["parsed"])
                if len(context) == len(folders):  # now read the importers too, as context
                    run.add_context([p for i in range(len(folders)) for p in context[i]],
                                    parsed, disk)
            elif request["op"] == "load":
                run.loaded(worker, request, answer, parsed)
    projects = projects_of(run.edges, run.parts)
    ids = {id(p): str(n) for n, p in enumerate(dict.fromkeys(projects.values()))}
    results = {k: v for k, v in run.failed.items() if k not in run.hidden}
    spec = [[r.code, r.severity] for r in rules]
    for worker in range(count):
        keys = [k for k in run.parts if run.owner[k] == worker and k not in run.hidden]
        if keys:
            pool.send(worker, {"op": "rules", "rules": spec,
                               "files": [[str(k), ids[id(projects[k])]] for k in keys],
                               "projects": {ids[id(projects[k])]: _project_data(projects[k])
                                            for k in keys}})
    while any(pool.busy(w) for w in range(count)):
        for _, _, answer in pool.answers():
            for key, found in answer["findings"].items():
                results[Path(key)] = [Finding(**f) for f in found]
    return results


class _Loads:
    """The files to read, who reads each, and what came back: the import graph is followed
    as answers arrive, each worker kept a few files ahead."""

    def __init__(self, pool: Pool, shown: dict[Path, Path]) -> None:
        self.pool, self.shown = pool, shown
        self.todo: deque[Path] = deque(shown)
        self.seen = set(shown)
        self.mine: list[deque[Path]] = [deque() for _ in range(pool.count)]  # parsed there already
        self.waiting = [0] * pool.count
        self.owner: dict[Path, int] = {}
        self.hidden: set[Path] = set()
        self.edges: dict[Path, set[Path]] = {}
        self.parts: dict[Path, Project] = {}
        self.failed: dict[Path, list[Finding]] = {}

    def pending(self) -> bool:
        return bool(self.todo or any(self.mine) or any(self.waiting))

    def dispatch(self) -> None:
        for worker, mine in enumerate(self.mine):
            while self.waiting[worker] < _AHEAD and (mine or self.todo):
                self.send(worker, mine.popleft() if mine else self.todo.popleft())

    def send(self, worker: int, key: Path) -> None:
        self.owner[key] = worker
        self.waiting[worker] += 1
        self.pool.send(worker, {"op": "load", "key": str(key),
                                "path": str(self.shown.get(key, key))})

    def queue(self, key: Path, parsed: dict[Path, int]) -> None:
        if key not in self.seen:
            self.seen.add(key)
            (self.mine[parsed[key]] if key in parsed else self.todo).append(key)

    def add_context(self, context: list[Path], parsed: dict[Path, int], disk: Disk) -> None:
        for path in context:
            key = disk.resolve(path)
            self.hidden.add(key)
            self.shown[key] = path
            if key in self.owner and str(path) != str(key):
                self.send(self.owner[key], key)  # read already under another name: again
            self.queue(key, parsed)

    def loaded(self, worker: int, request: dict[str, Any], answer: dict[str, Any],
               parsed: dict[Path, int]) -> None:
        self.waiting[worker] -= 1
        key = Path(request["key"])
        self.edges[key] = {Path(p) for p in answer["edges"]}
        if "failed" in answer:
            self.failed[key] = [Finding(**answer["failed"])]
        else:
            self.parts[key] = _project(answer["part"])
        for target in sorted(self.edges[key]):
            self.queue(target, parsed)


class _Worker:
    """One worker's state: the facts of the files it read, and the siblings it parsed."""

    def __init__(self) -> None:
        self.disk = Disk()
        self.parsed: Parsed = {}
        self.facts: dict[str, Facts] = {}
        self.named: set[Path] = set()

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        if request["op"] == "named":
            self.named = {Path(p) for p in request["named"]}
            if "path" in request and request["path"] != sys.path:
                # an import is "installed" (not listed as not read) by the caller's path, not
                # this process's (started with `-m`, it has its own folder first)
                sys.path[:] = request["path"]
                importlib.invalidate_caches()
                self.disk = Disk()
            return {}
        if request["op"] == "beside":
            before = set(self.parsed)
            found = importers_in(Path(request["folder"]), self.named, self.disk, self.parsed)
            return {"importers": [str(p) for p in found],
                    "parsed": [str(p) for p in set(self.parsed) - before]}
        if request["op"] == "load":
            loaded, edges, part = load(Path(request["path"]), Path(request["key"]), self.disk,
                                       self.parsed)
            if isinstance(loaded, Finding) or part is None:
                return {"failed": loaded.as_dict(), "edges": []}  # type: ignore[union-attr]
            self.facts[request["key"]] = loaded
            return {"edges": sorted(str(p) for p in edges), "part": _project_data(part)}
        if request["op"] == "rules":
            known = {r.code: r for r in all_rules(gated=False)}
            rules = tuple(replace(known[code], severity=severity)
                          for code, severity in request["rules"])
            projects = {pid: _project(data) for pid, data in request["projects"].items()}
            return {"findings": {key: [f.as_dict() for f in run_rules(
                with_project(self.facts[key], projects[pid]), rules)]
                for key, pid in request["files"]}}
        raise ValueError(f"unknown request {request['op']!r}")


def worker_main() -> NoReturn:
    """Answer requests from stdin, one message each, until stdin closes; then end the
    process at once. Its trees are freed with the process: an interpreter's normal exit
    would free them node by node (a third of a second under load) while the check waits."""
    import gc
    import traceback

    gc.disable()  # the trees live until the process ends; see analysis.collector_paused
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a stray print goes to stderr, never into the answers
    worker = _Worker()
    source = sys.stdin.buffer
    while len(head := source.read(8)) == 8:
        request = marshal.loads(source.read(int.from_bytes(head, "little")))
        try:
            answer = worker.answer(request)
        except Exception:  # reported to the caller, which stops the check with it
            answer = {"error": traceback.format_exc()}
        out.write(_frame(answer))
        out.flush()
    out.close()
    sys.stderr.flush()
    os._exit(0)
