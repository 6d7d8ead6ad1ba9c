"""The `splitsync env` report: collected data is JSON-ready; text shows devices and masks secrets."""

from __future__ import annotations

import json

from splitsync.tools.envreport import collect, relevant_variables, render_text


def test_relevant_variables_keep_launcher_and_nccl_and_mask_secrets() -> None:
    env = {"RANK": "1", "NCCL_SOCKET_IFNAME": "eth0", "SLURM_JOB_ID": "7", "HOME": "/root",
           "SPLITSYNC_TOKEN": "abc", "PATH": "/bin", "MASTER_ADDR": "n0"}
    assert relevant_variables(env) == {"MASTER_ADDR": "n0", "NCCL_SOCKET_IFNAME": "eth0",
                                       "RANK": "1", "SLURM_JOB_ID": "7",
                                       "SPLITSYNC_TOKEN": "<set>"}


def test_collect_is_json_ready_and_reads_the_given_environment() -> None:
    report = collect({"SLURM_JOB_ID": "5", "SLURM_PROCID": "1", "SLURM_NTASKS": "2",
                      "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_NNODES": "2",
                      "SLURM_JOB_NODELIST": "a[1-2]", "SLURM_STEP_ID": "0",
                      "SLURM_STEP_TASKS_PER_NODE": "1(x2)"})
    again = json.loads(json.dumps(report))
    assert again["launcher"]["launcher"] == "slurm"
    assert again["launcher"]["rank"] == 1 and again["launcher"]["master_addr"] == "a1"
    assert again["launcher"]["splitsync_run_defaults"]["rdzv_endpoint"] == "a1:29400"
    assert again["backends"]["gloo"] is True


def test_text_lists_gpus_with_memory() -> None:
    report = collect({})
    report["versions"].update(cuda="12.8", nccl="2.27.3")
    report["devices"] = [{"device": "cuda:0", "name": "NVIDIA H200", "memory_gib": 139.8,
                          "capability": "9.0"}]
    text = render_text(report)
    assert "cuda:0: NVIDIA H200, 139.8 GiB" in text
    assert "nccl:      2.27.3" in text
    assert "none (CPU only)" not in text
