"""init's settings: each is checked in exactly one place (listed here) and once, a bad value
names itself, a misspelt keyword names the nearest one, and init fits on a screen."""

from __future__ import annotations

import ast
import sys
import traceback
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import pytest

import splitsync
from splitsync.ft.options import ft_options
from splitsync.output.trackers import check_loggers
from splitsync.preemption.defaults import check_grace, parse_signals
from splitsync.preemption.settings import PreemptionSettings
from splitsync.preemption.sources import check_stop_file
from splitsync.run import config as run_config
from splitsync.strategies import check_name
from splitsync.tools.verify import record as verify
from splitsync.train.precision import check_precision_name

# setting -> (a bad value, the settings object that owns it, the one function that refuses it)
CHECKED_IN: dict[str, tuple[Any, str, str]] = {
    "seed": (-1, "RunConfig", "_check_seed"),
    "strategy": ("zero3", "RunConfig", "check_name"),
    "precision": ("fp8", "RunConfig", "check_precision_name"),
    "accumulate": (0, "RunConfig", "_check_accumulate"),
    "deterministic": (1, "RunConfig", "_check_bool"),
    "loggers": (["jsonl", "nope"], "RunConfig", "check_loggers"),
    "save_blocking": ("false", "CheckpointSettings", "_check_bool"),
    "guards": ("no", "GuardSettings", "_check_bool"),
    "debug": ("yes", "GuardSettings", "_check_bool"),
    "timeout": ("soon", "GuardSettings", "GuardSettings.__post_init__"),
    "desync_after": (0, "GuardSettings", "GuardSettings.__post_init__"),
    "straggler_threshold": (-1, "GuardSettings", "GuardSettings.__post_init__"),
    "ledger": ("yes", "LedgerSettings", "_check_bool"),
    "preempt_signals": (["SIGFOO"], "PreemptionSettings", "parse_signals"),
    "preempt_grace": (0, "PreemptionSettings", "check_grace"),
    "preempt_file": (3, "PreemptionSettings", "check_stop_file"),
    "fault_tolerance": ("elastic", "ft_options", "ft_options"),  # builds FTOptions
    "mesh": ({"tp": 3}, "mesh_shape", "mesh_shape"),  # builds MeshShape (needs the world size)
}

# the checking functions, by the names above: a good init() calls each once per setting it
# checks, and the owners' __post_init__ once each
CHECKERS: dict[str, Any] = {
    "_check_seed": run_config._check_seed, "check_name": check_name,
    "check_precision_name": check_precision_name,
    "_check_accumulate": run_config._check_accumulate, "_check_bool": run_config._check_bool,
    "check_loggers": check_loggers, "parse_signals": parse_signals, "check_grace": check_grace,
    "check_stop_file": check_stop_file, "ft_options": ft_options,
    "RunConfig.__post_init__": run_config.RunConfig.__post_init__,
    "CheckpointSettings.__post_init__": run_config.CheckpointSettings.__post_init__,
    "GuardSettings.__post_init__": run_config.GuardSettings.__post_init__,
    "LedgerSettings.__post_init__": run_config.LedgerSettings.__post_init__,
    "PreemptionSettings.__post_init__": PreemptionSettings.__post_init__,
}


def _qualified(filename: str, name: str, lineno: int) -> str:
    """Class.method for a method, else the function's name."""
    tree = ast.parse(Path(filename).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == name and \
                        fn.lineno <= lineno <= (fn.end_lineno or 0):
                    return f"{node.name}.{fn.name}"
    return name


def _splitsync_frames(exc: BaseException) -> list[str]:
    return [_qualified(f.filename, f.name, f.lineno or 0)
            for f in traceback.extract_tb(exc.__traceback__) if "splitsync" in f.filename]


@pytest.mark.parametrize("name", sorted(CHECKED_IN))
def test_each_setting_is_refused_in_its_one_place_naming_itself(name: str) -> None:
    bad, owner, where = CHECKED_IN[name]
    with pytest.raises((ValueError, TypeError)) as info:
        splitsync.init(**{name: bad})
    frames = _splitsync_frames(info.value)
    assert frames[-1] == where, (name, frames, info.value)
    assert owner in frames or f"{owner}.__post_init__" in frames, (name, frames)
    assert name in str(info.value) or repr(bad) in str(info.value), (name, info.value)


def test_a_check_that_joins_two_settings_is_the_config_s() -> None:
    with pytest.raises(ValueError, match="ledger=True.*run_dir") as info:
        splitsync.init(ledger=True)  # without run_dir
    assert _splitsync_frames(info.value)[-1] == "RunConfig._check_ledger_dir"


def test_every_init_keyword_is_listed_or_parsed_elsewhere() -> None:
    import inspect

    keywords = {n for n, p in inspect.signature(splitsync.init).parameters.items()
                if p.kind is p.KEYWORD_ONLY}
    # device and backend are parsed by torch, run_dir is any path; the ft_ ones by
    # ft_options with fault_tolerance (they need its launcher's environment)
    elsewhere = {"device", "backend", "run_dir", "ft_min_replicas", "ft_heartbeat_ms",
                 "ft_timeout", "ft_lighthouse"}
    assert keywords == set(CHECKED_IN) | elsewhere


def _counting(codes: dict[CodeType, str]) -> tuple[Counter[str], Any]:
    calls: Counter[str] = Counter()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code in codes:
            calls[codes[frame.f_code]] += 1

    return calls, profile


def _calls_during_init(**kwargs: Any) -> Counter[str]:
    codes = {fn.__code__: name for name, fn in CHECKERS.items()}
    calls, profile = _counting(codes)
    sys.setprofile(profile)
    try:
        run = splitsync.init(**kwargs)
    finally:
        sys.setprofile(None)
    run.close()
    return calls


def _once_each() -> Counter[str]:
    """What a good init() without fault tolerance must call: each check once per setting."""
    expected = Counter(where for setting, (_, _, where) in CHECKED_IN.items()
                       if setting not in ("fault_tolerance", "mesh") and "." not in where)
    expected.update(f"{owner}.__post_init__" for owner in
                    {"RunConfig", "CheckpointSettings", "GuardSettings", "LedgerSettings",
                     "PreemptionSettings"})
    return expected


@pytest.fixture
def plain_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_SIZE",
                "PMI_SIZE", verify.ENV_DIR):
        monkeypatch.delenv(key, raising=False)
    yield


def test_a_good_init_checks_each_setting_once(plain_env: None, tmp_path: Path) -> None:
    calls = _calls_during_init(run_dir=str(tmp_path), ledger=True, seed=0)
    assert calls == _once_each()


def test_a_verify_launch_checks_only_what_it_imposes(plain_env: None, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``splitsync verify`` imposes the strategy and the accumulation: those two (and the
    run_dir it moves) are checked again, with their new values; nothing else is."""
    monkeypatch.setenv(verify.ENV_DIR, str(tmp_path / "verify"))
    monkeypatch.setenv(verify.ENV_STRATEGY, "single")
    monkeypatch.setenv(verify.ENV_ACCUMULATE, "2")
    calls = _calls_during_init(run_dir=str(tmp_path / "run"), seed=0)
    expected = _once_each()
    expected.update(["check_name", "_check_accumulate"])  # the imposed values, once each
    assert calls == expected


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


def test_changed_checks_only_the_config_s_own_fields() -> None:
    config = splitsync.RunConfig(run_dir="out", sample_ledger=run_config.LedgerSettings(True))
    assert config.changed(strategy="ddp", accumulate=2).strategy == "ddp"
    with pytest.raises(ValueError, match="Unknown strategy 'zero3'"):
        config.changed(strategy="zero3")
    with pytest.raises(TypeError, match="not RunConfig's own fields"):
        config.changed(guards=False)  # a sub-setting is its settings object's
    with pytest.raises(ValueError, match="ledger=True"):
        config.changed(run_dir=None)


def test_the_config_reads_every_setting_under_its_init_keyword() -> None:
    import inspect

    keywords = {n for n, p in inspect.signature(splitsync.init).parameters.items()
                if p.kind is p.KEYWORD_ONLY and not n.startswith("ft_")}
    names = {name for name, _ in splitsync.RunConfig().settings()}
    assert names == keywords | {"strategy_options"}
    config = splitsync.RunConfig()
    assert all(getattr(config, name) == value for name, value in config.settings())
