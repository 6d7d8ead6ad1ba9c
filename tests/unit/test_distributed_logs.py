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
