"""run.progress / splitsync.output.progress: silent off rank 0, plain lines off a terminal, rich bar on one."""

from __future__ import annotations

import io

import pytest

from splitsync.output.progress import default_every, progress


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_hidden_returns_the_iterable_itself_and_prints_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = [1, 2, 3]
    out = io.StringIO()
    assert progress(data, show=False, stream=out) is data
    assert out.getvalue() == ""
    assert capsys.readouterr().out == ""


def test_plain_lines_every_n_and_once_at_the_end() -> None:
    out = io.StringIO()
    items = list(progress(range(10), show=True, desc="epoch 1", every=4, stream=out))
    assert items == list(range(10))
    lines = out.getvalue().splitlines()
    assert [line.split()[2] for line in lines] == ["4/10", "8/10", "10/10"]
    assert all(line.startswith("epoch 1: ") for line in lines)
    assert lines[-1].split()[3] == "(100%)"


def test_plain_lines_no_duplicate_final_line_when_total_is_a_multiple() -> None:
    out = io.StringIO()
    list(progress(range(8), show=True, every=4, stream=out))
    assert [line.split()[0] for line in out.getvalue().splitlines()] == ["4/8", "8/8"]


def test_unsized_iterable_counts_without_total() -> None:
    out = io.StringIO()
    list(progress((i for i in range(5)), show=True, every=2, stream=out))
    assert [line.split()[0] for line in out.getvalue().splitlines()] == ["2", "4", "5"]


def test_explicit_total_for_unsized_iterable() -> None:
    out = io.StringIO()
    list(progress((i for i in range(4)), show=True, total=4, every=2, stream=out))
    assert out.getvalue().splitlines()[-1].startswith("4/4 (100%)")


def test_default_every_is_a_quarter_of_a_pass() -> None:
    assert default_every(100) == 25
    assert default_every(10) == 3
    assert default_every(1) == 1
    assert default_every(None) == 100


def test_bad_every_is_rejected_by_name() -> None:
    with pytest.raises(ValueError, match="every=0"):
        progress([1], show=True, every=0)


def test_terminal_gets_a_rich_bar_not_plain_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TERM", "NO_COLOR", "TTY_COMPATIBLE", "FORCE_COLOR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    out = FakeTerminal()
    assert list(progress(range(7), show=True, desc="train", stream=out)) == list(range(7))
    text = out.getvalue()
    assert "train" in text and "7/7" in text
    assert "\x1b[" in text  # drawn with terminal control codes
    assert "(100%)" not in text  # not the plain-line format


def test_break_out_of_loop_stops_the_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm-256color")
    out = FakeTerminal()
    for i in progress(range(100), show=True, stream=out):
        if i == 3:
            break
    # A live display left running would keep a refresh thread alive; the next one would fail.
    assert list(progress(range(2), show=True, stream=out)) == [0, 1]
