"""init's settings: each is checked in exactly one place (listed here), a bad value names
itself, a misspelt keyword names the nearest one, and init fits on a screen."""

from __future__ import annotations

import ast
import traceback
from pathlib import Path
from typing import Any

import pytest

import splitsync

# setting -> (a bad value, the one function that refuses it)
CHECKED_IN: dict[str, tuple[Any, str]] = {
    "seed": (-1, "RunConfig.__post_init__"),
    "strategy": ("zero3", "check_name"),
    "precision": ("fp8", "check_precision_name"),
    "accumulate": (0, "RunConfig.__post_init__"),
    "debug": ("yes", "RunConfig.__post_init__"),
    "guards": ("no", "RunConfig.__post_init__"),
    "deterministic": (1, "RunConfig.__post_init__"),
    "save_blocking": ("false", "RunConfig.__post_init__"),
    "ledger": (True, "RunConfig.__post_init__"),  # without run_dir
    "loggers": (["jsonl", "nope"], "check_loggers"),
    "straggler_threshold": (-1, "RunConfig.__post_init__"),
    "preempt_signals": (["SIGFOO"], "parse_signals"),
    "preempt_grace": (0, "check_grace"),
    "preempt_file": (3, "check_stop_file"),
    "fault_tolerance": ("elastic", "ft_options"),
    "mesh": ({"tp": 3}, "mesh_shape"),
}


def _raised_in(exc: BaseException) -> str:
    """The innermost splitsync function the error came from (Class.method for methods)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "splitsync" in f.filename]
    frame = frames[-1]
    tree = ast.parse(Path(frame.filename).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == frame.name and \
                        fn.lineno <= frame.lineno <= (fn.end_lineno or 0):
                    return f"{node.name}.{fn.name}"
    return frame.name


@pytest.mark.parametrize("name", sorted(CHECKED_IN))
def test_each_setting_is_refused_in_its_one_place_naming_itself(name: str) -> None:
    bad, where = CHECKED_IN[name]
    with pytest.raises((ValueError, TypeError)) as info:
        splitsync.init(**{name: bad})
    assert _raised_in(info.value) == where, (name, info.value)
    assert name in str(info.value) or repr(bad) in str(info.value), (name, info.value)


def test_every_init_keyword_is_listed_or_parsed_elsewhere() -> None:
    import inspect

    keywords = {n for n, p in inspect.signature(splitsync.init).parameters.items()
                if p.kind is p.KEYWORD_ONLY}
    # device, backend and timeout are parsed by torch; the ft_ ones by ft_options with
    # fault_tolerance (they need its launcher's environment)
    elsewhere = {"device", "backend", "timeout", "run_dir", "ft_min_replicas",
                 "ft_heartbeat_ms", "ft_timeout", "ft_lighthouse"}
    assert keywords == set(CHECKED_IN) | elsewhere


def test_a_misspelt_keyword_names_the_nearest_one() -> None:
    with pytest.raises(TypeError, match="Did you mean `preempt_grace`"):
        splitsync.init(preempt_grce=5)
    with pytest.raises(TypeError, match="Did you mean `save_blocking`"):
        splitsync.init(save_bloking=False)


def test_init_fits_on_a_screen() -> None:
    src = Path(splitsync.__file__).resolve().parent / "api.py"
    (init,) = [n for n in ast.parse(src.read_text()).body
               if isinstance(n, ast.FunctionDef) and n.name == "init"]
    assert init.end_lineno - init.lineno + 1 <= 60
    assert "preempt_signals" in (splitsync.init.__doc__ or "")  # the keyword reference stays
