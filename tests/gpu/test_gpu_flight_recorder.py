"""NCCL's flight recorder under ``splitsync run``: on by default, its dumps under the run's
folder, readable by PyTorch's analyser. Skipped without CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from splitsync.launch.summary import flight_records

CUDA = torch.cuda.is_available()
pytestmark = [pytest.mark.skipif(not CUDA, reason="needs CUDA"), pytest.mark.timeout(240),
              pytest.mark.slow]
HERE = Path(__file__).resolve().parent
SRC = HERE.parent.parent / "src"


def test_flight_recorder_is_on_and_its_dump_is_read(tmp_path: Path) -> None:
    out = tmp_path / "seen.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_FR_", "TORCH_NCCL_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-m", "splitsync", "run", "-n", "1",
                           str(HERE / "fr_script.py"), str(out), str(tmp_path / "run")], env=env, text=True,
                          capture_output=True, timeout=200)
    assert done.returncode == 0, done.stdout + done.stderr
    seen = json.loads(out.read_text())
    assert seen["env"]["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert seen["env"]["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert seen["env"]["TORCH_FR_DUMP_TEMP_FILE"] == str(
        tmp_path / "run" / "flight_recorder" / "rank_")  # under the run's folder
    assert any("allreduce" in op for op in seen["ops"]), seen["ops"]
    # the analyser reads a folder of such dumps (the launcher does this after a failure)
    folder = tmp_path / "state"
    dumps = folder / "flight_recorder"
    dumps.mkdir(parents=True)
    (dumps / "rank_0").write_bytes(Path(seen["dump"]).read_bytes())
    (folder / "flight_recorder.path").write_text(str(dumps))
    lines = flight_records(str(folder))
    assert lines and "torch.distributed.flight_recorder" in lines[0], lines
