"""MPI's job id and the rendezvous port derived from it, on real sockets."""

from __future__ import annotations

import os
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitsync.distributed.env import EnvError, detect_env
from splitsync.distributed.mpi import MPI_PORTS, derived_port, mpich_job, openmpi_job

MPICH_RANK = {"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}


@given(st.text(min_size=1, max_size=40))
def test_derived_ports_stay_below_the_ephemeral_range_and_off_the_defaults(job: str) -> None:
    port = derived_port(job)
    assert port in MPI_PORTS and port not in (29400, 29500)
    assert derived_port(job) == port  # the same on every rank: no per-process hash seed


def test_openmpi_job_from_pmix_orte_or_the_hnp_uri() -> None:
    assert openmpi_job({"PMIX_NAMESPACE": "prterun-vm-41@1"}) == "openmpi-prterun-vm-41@1"
    assert openmpi_job({"OMPI_MCA_ess_base_jobid": "77"}) == "openmpi-77"
    assert openmpi_job({"OMPI_MCA_orte_hnp_uri": "76.0;tcp://10.0.0.1:5"}) == "openmpi-76.0"
    assert openmpi_job({}) is None


def test_mpich_job_is_the_process_at_the_other_end_of_pmi_fd(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ours, proxy = socket.socketpair()  # Hydra hands each rank one end of such a pair
    with ours, proxy:
        for key, value in {**MPICH_RANK, "PMI_FD": str(ours.fileno())}.items():
            monkeypatch.setenv(key, value)
        for key in ("MASTER_PORT", "MASTER_ADDR"):
            monkeypatch.delenv(key, raising=False)
        job = f"mpich-{socket.gethostname()}-{os.getpid()}"
        assert mpich_job(os.environ) == job
        e = detect_env(os.environ)  # this process's own environment: the socket is read
        assert (e.launcher, e.job_id, e.master_port, e.port_derived) == (
            "mpich", job, derived_port(job), True)
        os.fstat(ours.fileno())  # PMI_FD itself stays open for MPI_Init
        with pytest.raises(EnvError, match="MASTER_PORT"):
            detect_env(dict(os.environ))  # a copy is a recorded environment: not read
        # a job on several nodes has no job id every node shares
        monkeypatch.setenv("PMI_SIZE", "4")
        with pytest.raises(EnvError, match="several nodes needs MASTER_ADDR and MASTER_PORT"):
            detect_env(os.environ)


@pytest.mark.parametrize("fd", ["", "x", "9999"])
def test_no_pmi_socket_means_no_mpich_job(fd: str) -> None:
    assert mpich_job({"PMI_FD": fd}) is None
