"""mpirun of Open MPI and MPICH on one machine: two jobs at once, each bit-equal to
``splitsync run``, each rank on node 0."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from jobkit import SCRIPT, finish_job, job_env, python, start_job
from mpikit import MPIS, Mpi

pytestmark = pytest.mark.timeout(300)


# Open MPI in the suite; MPICH (the same checks under another mpirun) in the extended trials
@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.extended)
                                  if name != "openmpi" else name for name in MPIS])
def test_two_mpi_jobs_at_once_both_train_like_splitsync_run(
        name: str, request: pytest.FixtureRequest, reference: dict[str, Any],
        tmp_path: Path) -> None:
    mpi: Mpi = request.getfixturevalue(name)
    env = {**job_env(), **mpi.env}  # no MASTER_ADDR or MASTER_PORT: as users run it
    jobs = [start_job(mpi.command(2, *python(str(SCRIPT), str(tmp_path / job))),
                      tmp_path / job, env) for job in ("a", "b")]
    results = [finish_job(job, timeout=200) for job in jobs]
    for result in results:
        assert result["weights"] == reference["weights"]
        ranks = result["ranks"]
        assert [r["rank"] for r in ranks] == [0, 1]
        assert sorted(r["local_rank"] for r in ranks) == [0, 1]
        for r in ranks:  # one machine: node 0 for every rank, whatever its local rank
            assert (r["launcher"], r["world_size"], r["local_world_size"], r["node_rank"]) == (
                name, 2, 2, 0)
            assert r["master_addr"] == "127.0.0.1"
            assert r["omp_num_threads"] == str(r["torch_threads"])
        assert len({r["job_id"] for r in ranks}) == 1 and ranks[0]["job_id"]
    # each job met at its own port, derived from its own job id
    assert len({res["ranks"][0]["job_id"] for res in results}) == 2
    assert len({res["ranks"][0]["master_port"] for res in results}) == 2
