"""`splitsync env`: works without a GPU; --json parses and describes this machine."""

from __future__ import annotations

import json

from launch_helpers import splitsync


def test_env_text_without_gpu() -> None:
    r = splitsync("env", timeout=60, NCCL_DEBUG="INFO")
    assert r.returncode == 0, r.stderr
    for heading in ("torch:", "devices", "none (CPU only)", "backends", "gloo: yes",
                    "launcher", "environment variables", "NCCL_DEBUG=INFO"):
        assert heading in r.stdout


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


def test_env_reports_invalid_launcher_variables_without_failing() -> None:
    r = splitsync("env", "--json", timeout=60, RANK="5", WORLD_SIZE="2")
    assert r.returncode == 0, r.stderr
    launcher = json.loads(r.stdout)["launcher"]
    assert launcher["launcher"] == "invalid" and "RANK=5" in launcher["error"]
