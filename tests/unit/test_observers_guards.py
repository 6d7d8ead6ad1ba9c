"""Pure parts of the guards, the desync recorder and verify's comparison."""

from __future__ import annotations

import copy
import os
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from splitsync.observers.guards import (
    DeviceMismatchError,
    config_summary,
    guard_forward,
    is_comm_failure,
    param_fingerprints,
    user_site,
)
from splitsync.observers.guards.consistency import reference_ranks
from splitsync.observers.guards.desync import Recorder, debug_from_environ
from splitsync.run.config import GuardSettings, RunConfig
from splitsync.tools.verify.compare import compare_runs, likely_cause
from splitsync.tools.verify.record import from_environ


def test_config_summary_ignores_per_rank_values() -> None:
    a = config_summary(RunConfig(device="cuda:0"), ["t.py", "--local_rank=0", "--lr", "1"])
    b = config_summary(RunConfig(device="cuda:1"), ["t.py", "--local-rank=1", "--lr", "1"])
    assert a == b and a["argument 2"] == "1"
    assert config_summary(RunConfig(seed=1), ["t.py"]) != config_summary(RunConfig(), ["t.py"])


def test_reference_is_the_majority_and_rank0_breaks_ties() -> None:
    assert reference_ranks([5, 7, 7]) == {1, 2}
    assert reference_ranks([5, 7]) == {0}


def test_parameter_fingerprints_are_exact_and_order_sensitive() -> None:
    torch.manual_seed(0)
    m = nn.Linear(4, 3)
    twin = copy.deepcopy(m)
    assert torch.equal(param_fingerprints(m)[1], param_fingerprints(twin)[1])
    with torch.no_grad():
        twin.weight[1, 2] = torch.nextafter(twin.weight[1, 2], torch.tensor(2.0))
    names, fp = param_fingerprints(twin)
    assert names == ["weight", "bias"]
    assert fp[0] != param_fingerprints(m)[1][0] and fp[1] == param_fingerprints(m)[1][1]
    with torch.no_grad():
        swapped = copy.deepcopy(m)
        swapped.weight[0, 0], swapped.weight[0, 1] = m.weight[0, 1], m.weight[0, 0]
    assert param_fingerprints(swapped)[1][0] != param_fingerprints(m)[1][0]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def test_device_guard_explains_and_survives_copies() -> None:
    model = guard_forward(Net(), torch.device("cpu"))
    with pytest.raises(DeviceMismatchError, match="inputs on meta: input\\[0\\]"):
        model(torch.zeros(1, 3, device="meta"))
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.fc.bias.fill_(100.0)
    x = torch.zeros(1, 3)
    assert torch.all(twin(x) == 100.0) and not torch.all(model(x) == 100.0)
    again = pickle.loads(pickle.dumps(model))
    assert torch.equal(again(x), model(x))


def test_non_device_errors_are_not_rewritten() -> None:
    model = guard_forward(Net(), torch.device("cpu"))
    with pytest.raises(RuntimeError) as info:
        model(torch.zeros(1, 5))
    assert not isinstance(info.value, DeviceMismatchError)


def test_user_site_is_the_first_frame_outside_the_libraries() -> None:
    assert user_site().startswith(os.path.relpath(__file__) + ":")


def test_comm_failures_are_recognised() -> None:
    assert is_comm_failure(RuntimeError("Timed out waiting 3000ms for recv operation"))
    assert is_comm_failure(RuntimeError("Connection closed by peer [127.0.0.1]:1234"))
    assert not is_comm_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_comm_failure(ValueError("timed out"))


def test_debug_switch_and_recorder_restore() -> None:
    assert debug_from_environ({"SPLITSYNC_DEBUG": "1"})
    assert not debug_from_environ({})
    original = dist.all_reduce
    rec = Recorder(0, 2, None, None, None)  # type: ignore[arg-type]
    rec.install()
    assert dist.all_reduce is not original
    rec.uninstall()
    assert dist.all_reduce is original


def test_verify_recorder_is_off_without_the_environment() -> None:
    assert from_environ({}, 0, 1) is None


def _record(losses: list[float], grads: list[float], idx: list[list[int]],
            modules: tuple[str, ...] = ("Linear",)) -> dict:
    return {"init_hash": "h", "modules": list(modules), "used_run_loader": True,
            "passes": [{"loader": 1, "shuffle": True, "epoch": 0}],
            "steps": [{"loss": lo, "grad_norm": g, "indices": i, "rows": [], "pass": 1}
                      for lo, g, i in zip(losses, grads, idx, strict=True)]}


def test_comparison_passes_and_names_a_summed_loss() -> None:
    single = _record([2.0, 1.0], [4.0, 3.0], [[0, 1, 2, 3], [4, 5, 6, 7]])
    good = [_record([2.1, 1.1], [4.0, 3.0], [[0, 2], [4, 6]]),
            _record([1.9, 0.9], [4.0, 3.0], [[1, 3], [5, 7]])]
    results = compare_runs(single, good, 2)
    assert all(r.ok for r in results), results
    halved = [_record([1.05, 0.5], [2.0, 1.5], [[0, 2], [4, 6]]),
              _record([0.95, 0.5], [2.0, 1.5], [[1, 3], [5, 7]])]
    results = compare_runs(single, halved, 2)
    assert "summed over the batch" in likely_cause(results, single, halved, 2)


def test_comparison_names_dropout_and_overlap() -> None:
    single = _record([2.0], [4.0], [[0, 1, 2, 3]], ("Dropout", "Linear"))
    noisy = [_record([2.3], [4.0], [[0, 2]], ("Dropout",)), _record([1.9], [4.0], [[1, 3]])]
    assert "Dropout" in likely_cause(compare_runs(single, noisy, 2), single, noisy, 2)
    same = [_record([2.0], [4.0], [[0, 1]]), _record([2.0], [4.0], [[0, 1]])]
    assert "Unsharded data" in likely_cause(compare_runs(single, same, 2), single, same, 2)


def test_verify_recorder_trains_every_launch_at_the_references_global_batch(
        tmp_path: Path) -> None:
    data = torch.utils.data.TensorDataset(torch.arange(100.0))
    env = {"SPLITSYNC_VERIFY_DIR": str(tmp_path / "r"), "SPLITSYNC_VERIFY_NPROC": "2",
           "SPLITSYNC_VERIFY_STEPS": "3", "SPLITSYNC_VERIFY_SHARED": str(tmp_path)}
    ref = from_environ({**env, "SPLITSYNC_VERIFY_ROLE": "ref"}, 0, 2)
    one = from_environ({**env, "SPLITSYNC_VERIFY_ROLE": "follow"}, 0, 1)
    kw = {"dataset": data, "batch_size": 8, "shuffle": True}
    b = ref.loader_kwargs(dict(kw))  # the script as written: 8 per rank, 16 per step
    a = one.loader_kwargs(dict(kw))
    assert (a["batch_size"], b["batch_size"]) == (16, 8)
    assert len(a["dataset"]) == len(b["dataset"]) == 48  # 3 steps of the global batch
    evaluation = {"dataset": data, "batch_size": 50, "shuffle": False}
    assert one.loader_kwargs(dict(evaluation)) == evaluation
    with pytest.raises(ValueError, match="--batch"):
        from_environ({**env, "SPLITSYNC_VERIFY_BATCH": "15"}, 0, 2).loader_kwargs(dict(kw))


def test_launch_outcome_shows_the_traceback_end() -> None:
    from splitsync.tools.verify.launch import Outcome

    out = "noise\nTraceback (most recent call last):\n  File x\n    y()\nValueError: bad\nmore"
    assert Outcome(("x",), 1, out).tail().splitlines()[-1] == "ValueError: bad"


def test_collective_wait_plus_grace_fit_in_the_timeout() -> None:
    from datetime import timedelta

    from splitsync.observers.guards.attach import collective_timeout
    from splitsync.observers.guards.hangs import split_timeout

    for seconds in (1, 3, 60, 600, 3600):
        wait, grace = split_timeout(timedelta(seconds=seconds))
        assert wait.total_seconds() + grace == pytest.approx(seconds) and grace > 0
    config = RunConfig(guarding=GuardSettings(timeout=timedelta(seconds=60)))
    assert collective_timeout(config, 2, {}) == timedelta(seconds=54)
    assert collective_timeout(config, 1, {}) == timedelta(seconds=60)  # no guards at world 1
    off = RunConfig(guarding=GuardSettings(timeout=timedelta(seconds=60), guards=False))
    assert collective_timeout(off, 2, {}) == timedelta(seconds=60)
    assert collective_timeout(off, 2, {"SPLITSYNC_DEBUG": "1"}) == timedelta(seconds=54)


def test_a_peer_that_closed_its_connection_is_not_called_a_timeout() -> None:
    from datetime import timedelta

    from splitsync.observers.guards.hangs import Position, explain_failure

    me = Position(rank=0, call=7, op="all_reduce", site="train.py:12")
    closed = RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                          "[127.0.0.1]:41234")
    msg = str(explain_failure(closed, me, 2, timedelta(seconds=600), None, elapsed=27.04))
    first = msg.splitlines()[0]
    assert "failed after 27.0s: a peer closed the connection" in first
    assert "600s" not in first and "did not complete" not in first
    # a peer that closed its connection and never posted died: no desync advice
    assert "rank 1 died (its exit code or signal: in the launcher's report)" in msg
    assert "same collective calls" not in msg and "never arrived" not in msg
    slow = RuntimeError("Timed out waiting 540000ms for recv operation to complete")
    msg = str(explain_failure(slow, me, 2, timedelta(seconds=600), None, elapsed=540.2))
    assert "did not complete within the 600s timeout (after 540.2s)" in msg


def test_every_splitsync_module_is_library_code_for_the_call_site() -> None:
    """The user's call site skips splitsync's own frames, from any folder of the package."""
    import splitsync.distributed.comm
    import splitsync.run.runtime
    from splitsync.observers.guards.site import is_library_file

    assert is_library_file(splitsync.distributed.comm.__file__)
    assert is_library_file(splitsync.run.runtime.__file__)
    assert not is_library_file(__file__)


def test_a_dead_peer_on_this_host_is_named_with_its_signal_or_exit_code() -> None:
    import os
    import signal
    import time
    from datetime import timedelta

    import torch.distributed as dist

    from splitsync.observers.guards.hangs import Position, explain_failure, fate_of

    store = dist.HashStore()
    killed, exited = os.fork(), None
    if killed == 0:
        time.sleep(60)
        os._exit(0)
    exited = os.fork()
    if exited == 0:
        os._exit(3)
    try:
        for rank, pid in ((1, killed), (2, exited)):
            store.set(f"splitsync/guards/process/{rank}", f"{os.uname().nodename} {pid}")
        os.kill(killed, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (fate_of(store, 1) and fate_of(store, 2)):
            time.sleep(0.05)  # until both are zombies (not reaped: the launcher's part)
        assert fate_of(store, 1) == "signal SIGKILL"
        assert fate_of(store, 2) == "exit code 3"
        assert fate_of(store, 0) is None  # never posted
        me = Position(rank=0, call=3, op="all_reduce", site="train.py:9")
        closed = RuntimeError("Connection closed by peer [127.0.0.1]:4000")
        msg = str(explain_failure(closed, me, 3, timedelta(seconds=1), store, elapsed=0.2))
        assert "rank 1 died (signal SIGKILL)" in msg and "rank 2 died (exit code 3)" in msg
        assert "same collective calls" not in msg
    finally:
        for pid in (killed, exited):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
    assert fate_of(store, 1) == "exited"  # reaped
