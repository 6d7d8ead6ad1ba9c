"""What MPI launchers leave out: a job id that all ranks share, and a rendezvous port from it.

``mpirun`` starts the ranks but gives them no rendezvous address, and without a communicator
rank 0 cannot publish a port it picked. Every rank can, however, read a value that is the
same for all ranks of one job and differs between jobs, and hash it into a port:

- Open MPI: ``PMIX_NAMESPACE`` (ORTE's job id in 4.x, ``prterun-...@1`` in 5.x), the same on
  every node.
- MPICH's Hydra (and Intel MPI) put no job id in the environment. Each rank's PMI socket
  (``PMI_FD``) leads to the node's ``hydra_pmi_proxy``, one per job and node: its process id
  names the job on this node only.

Ports come from 25000-32767, below Linux's ephemeral range (32768-60999), so no outgoing
connection holds one; a collision with another job is caught when the group forms.
"""

from __future__ import annotations

import os
import socket
import struct
import zlib
from collections.abc import Mapping

__all__ = ["openmpi_job", "mpich_job", "derived_port", "MPI_PORTS"]

MPI_PORTS = range(25000, 32768)
_RESERVED = (29400, 29500)  # the default ports of `splitsync run` and torchrun


def openmpi_job(env: Mapping[str, str]) -> str | None:
    """Open MPI's job id, the same on every rank and node; None outside mpirun."""
    for name in ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"):
        if env.get(name):
            return f"openmpi-{env[name]}"
    uri = env.get("OMPI_MCA_orte_hnp_uri", "")  # "<jobid>.0;tcp://..."
    return f"openmpi-{uri.split(';')[0]}" if uri else None


def mpich_job(env: Mapping[str, str]) -> str | None:
    """This node's Hydra proxy, as ``mpich-HOST-PID``; None when PMI_FD is not its socket.

    Reads this process's own file descriptor: call it on the real environment only.
    """
    raw = env.get("PMI_FD", "").strip()
    if not raw.isdigit():
        return None
    try:
        with socket.socket(fileno=os.dup(int(raw))) as sock:  # a copy: PMI_FD stays open
            cred = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                   struct.calcsize("3i"))
    except (OSError, AttributeError):  # not a socket, or no SO_PEERCRED (not Linux)
        return None
    pid = struct.unpack("3i", cred)[0]
    return f"mpich-{socket.gethostname()}-{pid}" if pid > 0 else None


def derived_port(job: str) -> int:
    """A port in :data:`MPI_PORTS` from the job id: the same on every rank of the job."""
    port = MPI_PORTS.start + zlib.crc32(job.encode()) % len(MPI_PORTS)
    while port in _RESERVED:
        port += 1
    return port
