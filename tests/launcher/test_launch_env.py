"""`splitsync env`: works without a GPU; --json parses and describes this machine.

One run goes through `python -m splitsync env` in a fresh process; the other cases call
the same command line in this interpreter (each fresh process would import torch again).
"""

from __future__ import annotations

import json
import os

import pytest
from launch_helpers import splitsync

from splitsync.cli import main
from splitsync.testing import LAUNCHER_PREFIXES, LAUNCHER_VARS


def _env_here(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str,
              **extra: str) -> str:
    """``splitsync env ARGS`` in this process with no launcher variables but ``extra``."""
    for key in list(os.environ):
        if key in LAUNCHER_VARS or key.startswith(LAUNCHER_PREFIXES):
            monkeypatch.delenv(key)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    for key, value in extra.items():
        monkeypatch.setenv(key, value)
    capsys.readouterr()
    assert main(["env", *args]) == 0
    return capsys.readouterr().out


def test_env_text_without_gpu(monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    out = _env_here(monkeypatch, capsys, NCCL_DEBUG="INFO")
    for heading in ("torch:", "devices", "none (CPU only)", "backends", "gloo: yes",
                    "launcher", "environment variables", "NCCL_DEBUG=INFO"):
        assert heading in out


@pytest.mark.slow  # the command line in another interpreter
def test_env_json_parses_and_reports_launcher() -> None:
    r = splitsync("env", "--json", timeout=60, RANK="1", WORLD_SIZE="2", LOCAL_RANK="1",
                  MASTER_ADDR="10.1.2.3", SPLITSYNC_API_TOKEN="secret-value")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["devices"] == []
    assert report["backends"]["gloo"] is True
    assert report["launcher"]["launcher"] == "env"
    assert (report["launcher"]["rank"], report["launcher"]["world_size"]) == (1, 2)
    assert report["launcher"]["master_addr"] == "10.1.2.3"
    assert report["environment"]["MASTER_ADDR"] == "10.1.2.3"
    assert report["environment"]["SPLITSYNC_API_TOKEN"] == "<set>"
    assert "secret-value" not in r.stdout
    assert report["versions"]["torch"] and report["versions"]["python"]


def test_env_reports_invalid_launcher_variables_without_failing(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    out = _env_here(monkeypatch, capsys, "--json", RANK="5", WORLD_SIZE="2")
    launcher = json.loads(out)["launcher"]
    assert launcher["launcher"] == "invalid" and "RANK=5" in launcher["error"]
