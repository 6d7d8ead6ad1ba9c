"""splitsync.launch(fn, nprocs=2) from a real notebook: nbclient runs it on an ipykernel kernel.

The kernel spec is installed into a temporary directory and points at this interpreter,
so the kernel imports this checkout's splitsync (PYTHONPATH is inherited) and nothing is
fetched. The cells define their functions in the kernel's __main__, the case that
pickling by reference cannot handle.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from splitsync import launch
from splitsync.launch.notebook import LaunchFailed
from splitsync.testing import LAUNCHER_PREFIXES, LAUNCHER_VARS

pytestmark = pytest.mark.slow

SETUP = """\
import json
import torch
import splitsync
x = torch.randn(64, 64)
_ = x @ x  # the kernel used torch (and its thread pool) before launching
SCALE = 10
"""

TRAIN = """\
def train(steps, lr=0.1):
    import splitsync as ss
    with ss.init(seed=0) as run:
        model = run.model(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        for _ in range(steps):
            loss = model(torch.randn(8, 4) + run.rank).pow(2).mean()
            run.backward(loss)
            run.step(opt)
        weight = [round(v, 6) for v in run.unwrap(model).weight.flatten().tolist()]
        return {"rank": run.rank, "world": run.world_size, "steps": steps * SCALE,
                "weight": weight}

results = splitsync.launch(train, nprocs=2, args=(3,), kwargs={"lr": 0.05})
print("RESULTS", json.dumps(results))
"""

FAIL = """\
def broken():
    import splitsync as ss
    with ss.init() as run:
        if run.rank == 1:
            raise ValueError("rank one broke")
        return run.rank

try:
    splitsync.launch(broken, nprocs=2, timeout=120)
except splitsync.launch.notebook.LaunchFailed as exc:
    print("FAILED", json.dumps({"rank": exc.rank, "named": "rank one broke" in str(exc),
                                "traceback": "Traceback" in exc.details}))
"""

SPAWN = """\
try:
    splitsync.launch(train, nprocs=2, args=(1,), start_method="spawn")
except ValueError as exc:
    print("REFUSED", json.dumps(str(exc)))
"""


def _kernel_spec(tmp_path: Path) -> Path:
    from ipykernel.kernelspec import install  # what `python -m ipykernel install` runs

    prefix = tmp_path / "jupyter"
    install(kernel_name="splitsync-test", prefix=str(prefix))
    spec = json.loads((prefix / "share/jupyter/kernels/splitsync-test/kernel.json").read_text())
    assert spec["argv"][0] == sys.executable  # this venv's interpreter, nothing else
    return prefix / "share" / "jupyter"


def _stream(cell: dict, tag: str) -> object:
    text = "".join(o.get("text", "") for o in cell["outputs"] if o["output_type"] == "stream")
    lines = [line for line in text.splitlines() if line.startswith(tag + " ")]
    assert len(lines) == 1, text
    return json.loads(lines[0][len(tag) + 1:])


@pytest.mark.extended  # a kernel and two ranks; the launch from a function below stays
def test_notebook_cells_launch_two_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    data_dir = _kernel_spec(tmp_path)
    for key in list(os.environ):  # no launcher variables reach the kernel
        if key in LAUNCHER_VARS or key.startswith(LAUNCHER_PREFIXES):
            monkeypatch.delenv(key)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("JUPYTER_PATH", str(data_dir))
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(data_dir))
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in (SETUP, TRAIN, FAIL, SPAWN)]
    client = nbclient.NotebookClient(nb, kernel_name="splitsync-test", timeout=300,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()

    results = _stream(nb.cells[1], "RESULTS")
    assert [r["rank"] for r in results] == [0, 1]  # rank order
    assert all(r["world"] == 2 and r["steps"] == 30 for r in results)  # args and the cell's global
    assert results[0]["weight"] == results[1]["weight"]  # DDP kept the replicas identical

    failed = _stream(nb.cells[2], "FAILED")
    assert failed == {"rank": 1, "named": True, "traceback": True}

    refused = _stream(nb.cells[3], "REFUSED")
    assert "__main__" in refused and "start_method='fork'" in refused


def test_results_in_rank_order_and_a_failing_rank_raises() -> None:
    # Fork: a lambda and a local closure run without being pickled.
    offset = 100
    assert launch(lambda: __import__("os").environ["RANK"], nprocs=2) == ["0", "1"]

    def fail_on_one() -> int:
        import os

        if os.environ["RANK"] == "1":
            raise KeyError("only rank one")
        return offset

    with pytest.raises(LaunchFailed, match="(?s)rank 1 of 2 failed.*only rank one") as info:
        launch(fail_on_one, nprocs=2, timeout=60)
    assert info.value.rank == 1 and "Traceback" in info.value.details
