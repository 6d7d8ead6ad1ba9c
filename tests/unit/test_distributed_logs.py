"""Rank-zero printing and the rank-prefixed ``splitsync`` logger."""

from __future__ import annotations

import logging

import pytest

import splitsync
from splitsync.distributed.logs import attach_rank_handler, get_logger


def test_rank_prefix_and_root_logger_untouched() -> None:
    root_handlers = list(logging.getLogger().handlers)
    handler = attach_rank_handler(1, 2)
    try:
        record = logging.LogRecord("splitsync", logging.INFO, __file__, 1, "hello", None, None)
        assert handler.format(record) == "[rank 1/2] splitsync INFO: hello"
        assert logging.getLogger().handlers == root_handlers
    finally:
        get_logger().removeHandler(handler)


def test_print_only_on_main(capsys: pytest.CaptureFixture[str]) -> None:
    with splitsync.init(seed=0) as run:
        run.print("visible")
        run.is_main = False
        run.print("hidden")
    assert capsys.readouterr().out == "visible\n"


def test_close_removes_handler_and_is_idempotent() -> None:
    before = len(get_logger().handlers)
    run = splitsync.init(seed=0)
    assert len(get_logger().handlers) == before + 1
    run.close()
    run.close()
    assert len(get_logger().handlers) == before


def _library_step() -> None:
    """What a library does every step: warn from one line, then (as
    torch.distributed.checkpoint does in a save) change the filters for a moment, which
    makes Python forget that it showed the warning there."""
    import warnings

    warnings.warn("FSDPLinear returned a view tensor", UserWarning, stacklevel=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)


def _shown(steps: int, run_alive: bool) -> int:
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.resetwarnings()  # Python's own defaults, not the test runner's
        run = splitsync.init(seed=0) if run_alive else None
        try:
            for _ in range(steps):
                _library_step()
        finally:
            if run is not None:
                run.close()
    return sum("returned a view tensor" in str(w.message) for w in seen)


def test_a_warning_repeated_every_step_is_shown_once_while_a_run_is_open() -> None:
    import warnings

    assert _shown(4, run_alive=False) == 4  # Python's rule alone: once per step
    before = warnings.showwarning
    assert _shown(4, run_alive=True) == 1
    assert warnings.showwarning is before  # put back by run.close
