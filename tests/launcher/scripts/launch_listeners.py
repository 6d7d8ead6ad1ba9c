"""Record the TCP addresses that this worker and its agent (the parent) listen on (Linux),
and what the launcher handed over: the script's arguments and the launcher's variables.

usage: launch_listeners.py OUT [ARGS...] -- writes OUT/listen_<RANK>.json after forming the
group.
"""

import json
import os
import socket
import struct
import sys

import torch

import splitsync as ss


def _inodes(pid: int) -> set[str]:
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(target[8:-1])
    return found


def _address(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = struct.unpack("<4I", raw)  # /proc stores IPv6 as four host-order words
    return socket.inet_ntop(socket.AF_INET6, struct.pack(">4I", *words))


def listening(pid: int) -> list[str]:
    inodes, out = _inodes(pid), []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as fh:
            for line in fh.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                    host, port = cols[1].split(":")
                    out.append(f"{_address(host)}:{int(port, 16)}")
    return out


with ss.init(seed=0, device="cpu") as run:
    run.sum(torch.ones(1))
    linux = os.path.exists("/proc/net/tcp")  # elsewhere only the arguments are recorded
    report = {"worker": listening(os.getpid()) if linux else None,
              "agent": listening(os.getppid()) if linux else None,
              "args": sys.argv[2:], "world_size": os.environ.get("WORLD_SIZE"),
              "omp": os.environ.get("OMP_NUM_THREADS"),
              "master_addr": os.environ.get("MASTER_ADDR")}
    with open(os.path.join(sys.argv[1], f"listen_{run.rank}.json"), "w") as fh:
        json.dump(report, fh)
    run.barrier()
