"""Run torchrun's elastic agent for a checked launch spec and explain how it ended.

Everything ``splitsync run`` does after parsing its command line: the dry run's command,
the workers' environment, the agent itself and a one-paragraph report of each failure
(which rank, which exit code or signal, why the rendezvous did not happen).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from splitsync.distributed.rankstate import STATE_DIR_VAR
from splitsync.launch.argv import torchrun_argv, torchrun_command
from splitsync.launch.spec import LaunchSpec
from splitsync.launch.summary import flight_records, rank_lines
from splitsync.preemption.exit import FAILURE_NOTE, NOTES_VAR, PREEMPTED_EXIT_CODE, read_notes

__all__ = ["say", "accelerators", "dry_run", "run_agent", "report_failure", "report_children",
           "report_stop", "report_preempted", "explain_rendezvous"]


def say(message: str) -> None:
    """A message of ``splitsync run`` on stderr."""
    print(f"splitsync run: {message}", file=sys.stderr, flush=True)


def accelerators() -> int:
    """Visible accelerators of the most plentiful kind (imports torch)."""
    from splitsync.distributed.device import visible_device_count

    return max(visible_device_count(k) for k in ("cuda", "xpu", "mps"))


def dry_run(spec: LaunchSpec) -> int:
    """Print the equivalent torchrun command (with a free port when none was given)."""
    from splitsync.distributed.group import free_port

    if spec.rdzv_port == 0:
        spec = replace(spec, rdzv_port=free_port(spec.rdzv_host))
    print(torchrun_command(spec), flush=True)
    return 0


def run_agent(spec: LaunchSpec) -> int:
    """Run torchrun's agent in this process for ``spec``; returns the exit status.

    The rendezvous port must be chosen already (see ``rendezvous.reserve_endpoint``).
    torchrun's own failures are reported in one paragraph each, not as tracebacks.
    """
    from torch.distributed.run import main as torchrun_main

    for key in [k for k in os.environ if k.startswith("PET_")]:
        # torchrun reads PET_<OPTION> for every option missing from its argv (a PyTorchJob
        # sets several); they are folded into the spec already, so the argv is the whole truth.
        del os.environ[key]
    for key, value in spec.env:
        os.environ[key] = value  # the agent passes its environment on to the workers
    if spec.max_restarts > 0 or spec.min_nodes != spec.max_nodes:
        # Restarted workers must not reuse the agent's store: they would read the dead
        # workers' gloo addresses and fail to connect (pytorch issues 135712, 167288).
        os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    for note in spec.notes:
        say(note)
    if not spec.single_node:
        say(f"node {spec.node_rank if spec.node_rank is not None else '?'} of "
            f"{spec.min_nodes if spec.min_nodes == spec.max_nodes else f'{spec.min_nodes}-{spec.max_nodes}'}"
            f" nodes, rendezvous at {spec.endpoint} (from {spec.source}), "
            f"timeout {spec.rdzv_timeout}s")
    # Workers stopped by a preemption leave a note here and exit 0, so that the agent never
    # restarts them as failed; this command then exits with PREEMPTED_EXIT_CODE.
    notes = tempfile.mkdtemp(prefix="splitsync-stop-")
    os.environ[NOTES_VAR] = notes
    # Each worker leaves its state and its Python stacks here (faulthandler: a crash, the
    # agent's SIGTERM); after a failure they make one line per rank.
    states = tempfile.mkdtemp(prefix="splitsync-ranks-")
    os.environ[STATE_DIR_VAR] = states
    os.environ.setdefault("PYTHONFAULTHANDLER", "1")  # stacks even before init()
    try:
        try:
            with _marking_failures(notes):
                torchrun_main(torchrun_argv(spec))
        except Exception as exc:  # torchrun's failures, reported in one paragraph
            return report_stop(read_notes(notes), spec, exc, states)
        return report_stop(read_notes(notes), spec, None)
    finally:
        os.environ.pop(NOTES_VAR, None)
        os.environ.pop(STATE_DIR_VAR, None)
        shutil.rmtree(notes, ignore_errors=True)
        shutil.rmtree(states, ignore_errors=True)


@contextlib.contextmanager
def _marking_failures(folder: str) -> Iterator[None]:
    """While torchrun stops the workers because one failed (its process context, at once,
    then the agent, to restart them or for good), leave FAILURE_NOTE in ``folder``: the
    SIGTERM the survivors get is then no preemption to wait out (``preempt_grace``). A
    signal to the agent stops them through another path and leaves no note. torchrun
    makes its agent and process context itself, so their classes are wrapped for the
    length of this call and put back after."""
    from torch.distributed.elastic.agent.server.api import WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing.api import PContext

    mark = Path(folder) / FAILURE_NOTE

    def marking(original: Any, failed: Any) -> Any:
        def call(owner: Any, *args: Any, **kwargs: Any) -> Any:
            if not failed(owner, *args):
                return original(owner, *args, **kwargs)
            mark.write_text("a worker failed\n")
            try:
                return original(owner, *args, **kwargs)
            finally:
                mark.unlink(missing_ok=True)
        return call

    originals = (PContext.close, LocalElasticAgent._stop_workers)
    # a process context closes the others when one has failed (``_failures``, set first)
    PContext.close = marking(PContext.close,  # type: ignore[method-assign]
                             lambda ctx, *_: bool(getattr(ctx, "_failures", None)))
    LocalElasticAgent._stop_workers = marking(  # type: ignore[method-assign]
        LocalElasticAgent._stop_workers,
        lambda _agent, group, *_: group.state in (WorkerState.FAILED, WorkerState.UNHEALTHY))
    try:
        yield
    finally:
        PContext.close, LocalElasticAgent._stop_workers = originals  # type: ignore[method-assign]


def report_stop(notes: list[dict[str, Any]], spec: LaunchSpec,
                exc: Exception | None, states: str | None = None) -> int:
    """How the run ended, from torchrun's outcome and the workers' notes: a preemption (75)
    when one saved its stop step, or when they gave up at the grace period's end with no
    worker failing otherwise (a worker's crash makes the agent SIGTERM the others, which
    then wait for a stop step in vain: a failure); 0 when every worker had finished its
    work before it could stop; else torchrun's own outcome."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    statuses = {n.get("status") for n in notes}
    if "saved" in statuses or (notes and statuses != {"finished"}
                               and not isinstance(exc, ChildFailedError)):
        return report_preempted(notes, spec, exc)
    if notes and statuses == {"finished"} and len(notes) >= spec.nproc_per_node and (
            not isinstance(exc, ChildFailedError)):
        say(f"{notes[0].get('signal', 'a signal')} came when every worker had finished its "
            f"work (step {notes[0].get('step')}): nothing was left to stop.")
        return 0
    return 0 if exc is None else report_failure(exc, spec, states)


def report_preempted(notes: list[dict[str, Any]], spec: LaunchSpec,
                     exc: Exception | None) -> int:
    """The workers stopped for a preemption: say where they stopped; PREEMPTED_EXIT_CODE."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    saved = [n for n in notes if n.get("status") == "saved"]
    signal_name = notes[0].get("signal", "a signal")
    if saved:
        first = saved[0]
        say(f"preempted by {signal_name}: the workers stopped after step {first['step']} and "
            f"saved it ({first['path']}). Launch the same command again to continue.")
    else:
        note = next((n for n in notes if n.get("status") == "deadline"), notes[0])
        step = note.get("step")
        kept = f"step {step} ({note.get('path')})" if step is not None else "none"
        say(f"preempted by {signal_name}: no step boundary came within the workers' grace "
            f"period, so they exited with their previous checkpoint: {kept}. Launch the same "
            "command again to continue from it.")
    if isinstance(exc, ChildFailedError):  # a worker died after the notes were written
        say(f"(also: rank(s) {', '.join(str(r) for r in sorted(exc.failures))} failed while "
            "exiting; their output is above)")
    elif exc is not None and not isinstance(exc, SignalException):
        say(f"(also: {type(exc).__name__}: {exc})")
    noted = len(notes)
    if noted < spec.nproc_per_node:
        say(f"({noted} of this node's {spec.nproc_per_node} workers confirmed the stop)")
    return PREEMPTED_EXIT_CODE


def report_failure(exc: Exception, spec: LaunchSpec, states: str | None = None) -> int:
    """Explain a failure of torchrun's agent; returns the exit status (re-raises others).
    ``states``: the workers' state folder, for one line per rank of this node."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError

    if isinstance(exc, ChildFailedError):
        if states is not None:
            first = spec.nproc_per_node * (spec.node_rank or 0)
            ranks = range(first, first + spec.nproc_per_node)
            say("what each rank was doing:")
            for line in rank_lines(states, ranks, {r: f.exitcode
                                                   for r, f in exc.failures.items()}):
                say(f"  {line}")
            for line in flight_records(states):
                say(line)
        return report_children(exc.failures)
    if isinstance(exc, SignalException):
        say(f"stopped by {exc.sigval.name}; workers were terminated.")
        return 128 + int(exc.sigval)
    if isinstance(exc, RendezvousError):
        say(explain_rendezvous(exc, spec))
        return 1
    raise exc


def report_children(failures: dict[int, Any]) -> int:
    """One line per failed worker and a summary; the first failure's exit code."""
    first = min(failures, key=lambda r: failures[r].timestamp)
    for rank in sorted(failures):
        f = failures[rank]
        how = (f"was killed by signal {signal.Signals(-f.exitcode).name}" if f.exitcode < 0
               else f"exited with code {f.exitcode}")
        detail = f": {f.message.splitlines()[0]}" if isinstance(f.message, str) and f.message \
            and not f.message.startswith("To enable traceback") else ""
        say(f"rank {rank} (local rank {f.local_rank}, pid {f.pid}) {how}{detail}")
    code = failures[first].exitcode
    ranks = ", ".join(str(r) for r in sorted(failures))
    say(f"failed: rank(s) {ranks}; first failure: rank {first}. Its output is above.")
    if code < 0:
        return 128 + (-code)
    return code if 0 < code < 256 else 1


def explain_rendezvous(exc: BaseException, spec: LaunchSpec) -> str:
    from torch.distributed.elastic.rendezvous import (
        RendezvousConnectionError,
        RendezvousTimeoutError,
    )

    """One sentence on why the nodes did not meet, and what to check."""
    host, port = spec.rdzv_host, spec.rdzv_port
    if isinstance(exc, RendezvousConnectionError):
        return (f"could not reach the rendezvous at host {host} port {port} within "
                f"{min(spec.rdzv_timeout, 60)}s. Check that node 0 runs `splitsync run` with the "
                "same --rdzv-endpoint, that the host name resolves and that the port is open "
                "(firewall); `splitsync env` on each node shows its addresses.")
    if isinstance(exc, RendezvousTimeoutError):
        return (f"the nodes did not all meet at {spec.endpoint} within --rdzv-timeout "
                f"{spec.rdzv_timeout}s (need {spec.min_nodes} node(s)). Start the same command "
                "on every node, with the same --rdzv-endpoint and --rdzv-id.")
    return f"rendezvous at {spec.endpoint} failed: {exc}"
