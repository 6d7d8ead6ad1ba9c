"""``splitsync ckpt inspect | convert | verify`` on checkpoints that 2 gloo ranks wrote.

One spawn writes every checkpoint these tests read: DDP (with a scheduler, a GradScaler, an
EMA model, a plain object and a loader), FSDP2 (two steps), HSDP (2 replicas), a tiny GPT-2
under FSDP2, and a DDP run into S3 (moto's server on loopback). The checks then run offline in this process,
with no process group, as a user would run the command.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import splitsync as ss
from splitsync import STRATEGY_NAMES
from splitsync.cli import main as cli
from splitsync.testing import clean_env, spawn

# One spawn writes every checkpoint: generous limits, for a loaded machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
fsspec = pytest.importorskip("fsspec")
BUCKET = "ckpt-cmd"


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


class ShadowEMA:
    """A hand-written EMA of the kind a user registers: state_dict of plain tensors."""

    def __init__(self, model: nn.Module, decay: float = 0.5) -> None:
        self.decay = decay
        self.shadow = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def update(self, model: nn.Module) -> None:
        for k, v in model.state_dict().items():
            self.shadow[k].mul_(self.decay).add_(v.detach(), alpha=1 - self.decay)

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "shadow": dict(self.shadow)}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.decay, self.shadow = sd["decay"], dict(sd["shadow"])


class Payload:
    """What a forged checkpoint would run when unpickled without weights_only."""

    def __init__(self, sentinel: str) -> None:
        self.sentinel = sentinel

    def __reduce__(self):
        return (open, (self.sentinel, "w"))


def _full(model: nn.Module) -> dict[str, np.ndarray]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {k: v.detach().cpu().numpy().copy() for k, v in sd.items()}


def _full_optim(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, np.ndarray]:
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
    )

    osd = get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
    return {f"{p}.{k}": v.detach().cpu().numpy().copy() for p, st in osd["state"].items()
            for k, v in st.items() if isinstance(v, torch.Tensor)}


def _steps(run: ss.Run, model: nn.Module, opt: torch.optim.Optimizer, n: int,
           after: Any = None) -> None:
    g = torch.Generator().manual_seed(run.rank)
    for _ in range(n):
        x = torch.randn(4, 8, generator=g)
        run.backward(model(x).pow(2).mean())
        run.step(opt)
        if after is not None:
            after()


def _gpt2(rank: int, run: ss.Run, root: str, config_dir: str) -> dict[str, Any]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = run.model(GPT2LMHeadModel(GPT2Config.from_pretrained(config_dir)), strategy="fsdp")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    run.resume(root, model=model, optimizer=opt)
    g = torch.Generator().manual_seed(rank)
    for _ in range(2):
        ids = torch.randint(0, 64, (2, 8), generator=g)
        run.backward(model(input_ids=ids, labels=ids).loss)
        run.step(opt)
    run.save(root)
    return _full(model)


def write_all(rank: int, world: int, base: str, s3: str, config_dir: str) -> dict[str, Any]:
    """Every checkpoint the tests read; rank 0 returns the final weights of each."""
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
    from torch.utils.data import TensorDataset

    out: dict[str, Any] = {}
    with ss.init(seed=0) as run:
        # DDP: everything a training run registers, plus an extra and a loader mid-epoch.
        model = run.model(_net(), strategy="ddp")
        opt = torch.optim.AdamW(model.parameters(), lr=0.05)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
        ema = AveragedModel(_net(), multi_avg_fn=get_ema_multi_avg_fn(0.9))
        loader = run.loader(TensorDataset(torch.arange(32.0)), batch_size=4, shuffle=True)
        run.resume(f"{base}/ddp", model=model, optimizer=opt, scheduler=sched, scaler=scaler,
                   ema=ema, table=ShadowEMA(model.module))
        batches = iter(loader)
        for _ in range(3):
            next(batches)
            _steps(run, model, opt, 1, after=lambda: (sched.step(), ema.update_parameters(
                model.module)))
        run.save(f"{base}/ddp", best=0.25, counts=torch.arange(6))
        out["ddp"], out["ddp_ema"] = _full(model), _full(ema.module)
        out["ddp_optim"] = _full_optim(model, opt)

        # FSDP2: two checkpoints (steps 2 and 3), the older one kept for --step.
        model = run.model(_net(), strategy="fsdp")
        opt = torch.optim.Adam(model.parameters(), lr=0.05)
        run.resume(f"{base}/fsdp", model=model, optimizer=opt)
        _steps(run, model, opt, 2)
        run.save(f"{base}/fsdp")
        out["fsdp_2"] = _full(model)
        _steps(run, model, opt, 1)
        run.save(f"{base}/fsdp")
        out["fsdp"], out["fsdp_optim"] = _full(model), _full_optim(model, opt)

        # HSDP: 2 replicas of a 1-way shard, if the strategy exists in this tree.
        if "hsdp" in STRATEGY_NAMES:
            model = run.model(_net(), strategy="hsdp", replicate=2)
            opt = torch.optim.AdamW(model.parameters(), lr=0.05)
            run.resume(f"{base}/hsdp", model=model, optimizer=opt)
            _steps(run, model, opt, 2)
            run.save(f"{base}/hsdp")
            out["hsdp"], out["hsdp_optim"] = _full(model), _full_optim(model, opt)
            out["hsdp_mesh"] = dict(zip(model[0].weight.device_mesh.mesh_dim_names,
                                        model[0].weight.device_mesh.shape, strict=True))

        # DDP into S3 (through moto's server).
        model = run.model(_net(), strategy="ddp")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        run.resume(s3, model=model, optimizer=opt)
        _steps(run, model, opt, 2)
        run.save(s3)
        out["s3"] = _full(model)

        if config_dir:  # transformers is installed
            out["gpt2"] = _gpt2(rank, run, f"{base}/gpt2", config_dir)
    return out if rank == 0 else {}


@pytest.fixture(scope="module")
def s3_env() -> Iterator[dict[str, str]]:
    """moto's standalone S3 server on 127.0.0.1, with s3fs pointed at it by environment."""
    pytest.importorskip("s3fs")
    server_mod = pytest.importorskip("moto.server")
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "FSSPEC_S3_ENDPOINT_URL": f"http://{host}:{port}"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    fsspec.config.set_conf_env(fsspec.config.conf)
    fsspec.filesystem("s3").mkdir(BUCKET)
    try:
        yield env
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        fsspec.config.conf.pop("s3", None)
        server.stop()


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory, s3_env: dict[str, str]) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("ckcmd")
    config_dir = ""
    if importlib.util.find_spec("transformers") is not None:  # else only --hf is skipped
        from transformers import GPT2Config

        GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                   bos_token_id=0, eos_token_id=0, architectures=["GPT2LMHeadModel"]
                   ).save_pretrained(base / "gpt2-config")
        config_dir = str(base / "gpt2-config")
    s3 = f"s3://{BUCKET}/{uuid.uuid4().hex}/run"
    env = {**os.environ, **s3_env, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    final = spawn(write_all, 2, str(base), s3, config_dir, env=env, timeout=600)[0]
    return {"base": base, "s3": s3, "final": final, "config": base / "gpt2-config"}


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli(["ckpt", *map(str, argv)])
    got = capsys.readouterr()
    return code, got.out, got.err


def _inspect(capsys: pytest.CaptureFixture[str], where: Any) -> dict[str, Any]:
    code, out, err = _run(capsys, "inspect", where, "--json")
    assert code == 0, err
    return json.loads(out)


def _load(path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(path))


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k


# --- FSDP2 -> one safetensors file ------------------------------------------------------------
def test_fsdp_convert_loads_with_plain_safetensors(made: dict[str, Any], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "weights.safetensors"
    code, text, err = _run(capsys, "convert", made["base"] / "fsdp", out)
    assert code == 0, err
    assert "step 3" in text and str(out) in text
    want = tmp_path / "want.npz"
    np.savez(want, **{k.replace(".", "|"): v for k, v in made["final"]["fsdp"].items()})
    # A fresh interpreter without splitsync: -I (no user site, no cwd), -S (no .pth files,
    # so not even an editable install), only the directories torch/safetensors live in.
    site = sorted({str(Path(m.__file__).resolve().parents[1]) for m in (np, torch)})
    script = textwrap.dedent(f"""
        import importlib.util, sys
        sys.path[:0] = {site!r}
        assert importlib.util.find_spec("splitsync") is None, "splitsync is importable"
        import numpy as np
        from safetensors.numpy import load_file
        got = load_file({str(out)!r})
        want = {{k.replace("|", "."): v for k, v in np.load({str(want)!r}).items()}}
        assert sorted(got) == sorted(want), (sorted(got), sorted(want))
        for k, v in want.items():
            assert got[k].dtype == v.dtype and np.array_equal(got[k], v), k
        print("equal", len(got))
    """)
    res = subprocess.run([sys.executable, "-I", "-S", "-c", script], capture_output=True,
                         text=True, timeout=120, env=clean_env(), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["equal", "4"]


def test_fsdp_convert_step_dtype_and_optimizer(made: dict[str, Any], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors import safe_open

    root = made["base"] / "fsdp"
    code, _, err = _run(capsys, "convert", root, tmp_path / "s2.safetensors", "--step", "2")
    assert code == 0, err
    _same(_load(tmp_path / "s2.safetensors"), made["final"]["fsdp_2"])
    assert not np.array_equal(made["final"]["fsdp_2"]["0.weight"],
                              made["final"]["fsdp"]["0.weight"])  # two different steps

    code, _, err = _run(capsys, "convert", root, tmp_path / "bf.safetensors", "--dtype", "bf16",
                        "--optimizer", tmp_path / "optim.pt")
    assert code == 0, err
    with safe_open(str(tmp_path / "bf.safetensors"), "pt") as f:
        got = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open's API
        assert f.metadata()["format"] == "pt" and f.metadata()["splitsync_step"] == "3"
    for k, v in made["final"]["fsdp"].items():
        assert got[k].dtype == torch.bfloat16
        assert torch.equal(got[k], torch.from_numpy(v).to(torch.bfloat16))
    osd = torch.load(tmp_path / "optim.pt", weights_only=True)
    flat = {f"{p}.{k}": v.numpy() for p, st in osd["state"].items() for k, v in st.items()}
    _same(flat, made["final"]["fsdp_optim"])
    assert osd["param_groups"][0]["params"] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    # The file is what set_optimizer_state_dict takes: it loads into a fresh optimizer.
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    net = _net()
    fresh = torch.optim.Adam(net.parameters(), lr=0.05)
    set_optimizer_state_dict(net, fresh, osd)
    assert torch.equal(fresh.state[net[0].weight]["exp_avg"],
                       torch.from_numpy(made["final"]["fsdp_optim"]["0.weight.exp_avg"]))


def test_fsdp_inspect_and_verify(made: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    root = made["base"] / "fsdp"
    report = _inspect(capsys, root)
    assert report["latest"] == "step-000003"
    assert [s["name"] for s in report["steps"]] == ["step-000003", "step-000002"]
    s = report["steps"][0]
    assert (s["status"], s["checksums"], s["strategy"], s["world_size"], s["layout"]) == \
        ("complete", "ok", "fsdp", 2, "sharded")
    model = s["holds"]["model"]["model"]
    assert (model["tensors"], model["elements"], model["dtypes"]) == (4, 8 * 16 + 16 + 16 * 4 + 4,
                                                                      ["float32"])
    opt = s["holds"]["optimizer"]["optimizer"]
    assert opt["type"] == "torch.optim.adam.Adam" and opt["model"] == "model"
    assert opt["state_keys"] == ["exp_avg", "exp_avg_sq", "step"] and opt["lr"] == [0.05]
    assert s["bytes"] == sum(s["files"].values()) and "dcp/.metadata" in s["files"]
    assert s["rng"]["ranks"] == 2 and "torch" in s["rng"]["kinds"]
    code, text, _ = _run(capsys, "inspect", root)
    assert code == 0 and "written by fsdp, world size 2" in text
    code, text, _ = _run(capsys, "verify", root)
    assert code == 0 and text.count(": ok") == 2
    code, text, _ = _run(capsys, "verify", root, "--json")
    assert code == 0 and json.loads(text)["ok"] is True


@pytest.mark.skipif("hsdp" not in STRATEGY_NAMES, reason="no hsdp strategy in this tree")
def test_hsdp_inspect_convert_verify(made: dict[str, Any], tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    root = made["base"] / "hsdp"
    assert made["final"]["hsdp_mesh"] == {"replicate": 2, "shard": 1}
    s = _inspect(capsys, root)["steps"][0]
    assert (s["name"], s["status"], s["strategy"], s["world_size"], s["layout"]) == \
        ("step-000002", "complete", "hsdp", 2, "sharded")
    assert s["holds"]["optimizer"]["optimizer"]["state_keys"] == ["exp_avg", "exp_avg_sq", "step"]
    assert _run(capsys, "verify", root)[0] == 0
    code, _, err = _run(capsys, "convert", root, tmp_path / "h.safetensors",
                        "--optimizer", tmp_path / "h.pt")
    assert code == 0, err
    _same(_load(tmp_path / "h.safetensors"), made["final"]["hsdp"])
    osd = torch.load(tmp_path / "h.pt", weights_only=True)
    _same({f"{p}.{k}": v.numpy() for p, st in osd["state"].items() for k, v in st.items()},
          made["final"]["hsdp_optim"])


# --- DDP: what it holds -----------------------------------------------------------------------
def test_ddp_inspect_lists_everything_registered(made: dict[str, Any],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    s = _inspect(capsys, made["base"] / "ddp")["steps"][0]
    assert (s["name"], s["strategy"], s["world_size"], s["layout"], s["checksums"]) == \
        ("step-000003", "mixed", 2, "full", "ok")
    assert s["strategies"] == {"ema": "single", "model": "ddp"}
    holds = s["holds"]
    assert list(holds["model"]) == ["model"] and list(holds["ema"]) == ["ema", "table"]
    assert holds["ema"]["ema"]["type"] == "torch.optim.swa_utils.AveragedModel"
    assert holds["ema"]["table"]["type"].endswith("ShadowEMA")
    assert holds["ema"]["table"]["tensors"] == 4
    assert holds["scheduler"]["scheduler"]["last_epoch"] == 3
    assert holds["scheduler"]["scheduler"]["last_lr"] == [0.05 * 0.5 ** 3]
    assert holds["scaler"]["scaler"]["scale"] == 256.0
    assert holds["optimizer"]["optimizer"]["type"] == "torch.optim.adamw.AdamW"
    assert s["loaders"] == [{"epoch": 0, "consumed": 24}]
    assert s["rng"]["loader_generators"] == 1
    assert s["extra"] == {"best": 0.25} and s["tensor_extra"]["counts"]["elements"] == 6
    code, text, _ = _run(capsys, "inspect", made["base"] / "ddp")
    for line in ("scheduler  scheduler", "scaler     scaler", "ema        ema",
                 "ema        table", "loaders: epoch 0, 24 samples consumed", "extra      best=0.25"):
        assert line in text, (line, text)


def test_ddp_convert_model_ema_and_optimizer(made: dict[str, Any], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors import safe_open

    root = made["base"] / "ddp"
    code, _, err = _run(capsys, "convert", root, tmp_path / "m.safetensors",
                        "--optimizer", tmp_path / "o.safetensors")
    assert code == 0, err
    _same(_load(tmp_path / "m.safetensors"), made["final"]["ddp"])
    with safe_open(str(tmp_path / "o.safetensors"), "np") as f:
        flat = {k.removeprefix("state."): f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        groups = json.loads(f.metadata()["param_groups"])
    _same(flat, made["final"]["ddp_optim"])
    assert groups[0]["params"] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    code, _, err = _run(capsys, "convert", root, tmp_path / "ema.safetensors", "--model", "ema")
    assert code == 0, err
    _same(_load(tmp_path / "ema.safetensors"), made["final"]["ddp_ema"])
    code, _, err = _run(capsys, "convert", root, tmp_path / "x.safetensors", "--model", "nope")
    assert code == 1 and "holds no model 'nope'; it holds ['ema', 'model']" in err


# --- damage and bad input -----------------------------------------------------------------------
def test_damage_is_found_and_named(made: dict[str, Any], tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "fsdp"
    shutil.copytree(made["base"] / "fsdp", root)
    shard = root / "step-000003" / "dcp" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(data)
    code, text, _ = _run(capsys, "verify", root)
    assert code == 1
    assert f"{root / 'step-000003'}: FAILED: dcp/__1_0.distcp fails its XXH3-128" in text
    assert f"{root / 'step-000002'}: ok" in text
    assert _run(capsys, "verify", root, "--step", "2")[0] == 0
    s = _inspect(capsys, root)["steps"][0]
    assert (s["status"], s["checksums"]) == ("damaged", "failed")
    assert "tensors" not in s["holds"]["model"]["model"]  # nothing read from damaged files
    code, _, err = _run(capsys, "convert", root, tmp_path / "a.safetensors", "--step", "3")
    assert code == 1 and f"{root / 'step-000003'} is damaged: dcp/__1_0.distcp fails" in err
    assert not (tmp_path / "a.safetensors").exists()
    code, _, err = _run(capsys, "convert", root, tmp_path / "b.safetensors")
    assert code == 0 and f"skipped {root / 'step-000003'}: dcp/__1_0.distcp" in err
    _same(_load(tmp_path / "b.safetensors"), made["final"]["fsdp_2"])

    (root / "step-000002" / "manifest.json").unlink()
    code, text, _ = _run(capsys, "verify", root, "--step", "2")
    assert code == 1 and "manifest.json is missing" in text
    code, _, err = _run(capsys, "convert", root / "step-000002", tmp_path / "c.safetensors")
    assert code == 1
    assert f"{root / 'step-000002'} is not a complete checkpoint: manifest.json is missing" in err


def test_bad_paths_name_the_path_and_what_was_expected(
        made: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.txt").write_text("x")
    expected = "expected a checkpoint directory"
    for action in ("inspect", "verify"):
        for bad, says in ((tmp_path / "nope", "no such directory"),
                          (tmp_path / "file.txt", "is a file"),
                          (tmp_path / "empty", "is not a checkpoint")):
            code, _, err = _run(capsys, action, bad)
            assert code == 1 and str(bad) in err and says in err and expected in err, err
    code, _, err = _run(capsys, "convert", made["base"] / "fsdp", tmp_path / "o.safetensors",
                        "--step", "7")
    assert code == 1 and "there is no step 7 (committed steps: 3, 2)" in err
    code, _, err = _run(capsys, "convert", made["base"] / "fsdp", tmp_path / "o.safetensors",
                        "--dtype", "int3")
    assert code == 1 and "--dtype 'int3'" in err


def test_a_pickled_payload_is_refused_not_run(made: dict[str, Any], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from splitsync.ckpt.store import read_manifest, write_manifest

    root = tmp_path / "ddp"
    shutil.copytree(made["base"] / "ddp", root)
    step = root / "step-000003"
    body = {k: v for k, v in read_manifest(step).items() if k not in ("files", "format")}
    torch.save({"model": {"model": Payload(str(tmp_path / "ran"))}}, step / "state.pt")
    write_manifest(step, body)  # checksums match: only weights_only stands in the way
    code, _, err = _run(capsys, "convert", root, tmp_path / "o.safetensors", "--step", "3")
    assert code == 1 and "refused to load state.pt" in err
    assert not (tmp_path / "ran").exists()


# --- object storage ---------------------------------------------------------------------------
def test_s3_inspect_verify_convert(made: dict[str, Any], tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    url = made["s3"]
    s = _inspect(capsys, url)["steps"][0]
    assert (s["name"], s["status"], s["strategy"], s["world_size"]) == \
        ("step-000002", "complete", "ddp", 2)
    assert s["holds"]["optimizer"]["optimizer"]["type"] == "torch.optim.sgd.SGD"
    assert _run(capsys, "verify", url)[0] == 0
    code, _, err = _run(capsys, "verify", f"s3://{BUCKET}/no-such-run")
    assert code == 1 and f"s3://{BUCKET}/no-such-run: nothing there" in err
    code, _, err = _run(capsys, "convert", url, tmp_path / "s3.safetensors")
    assert code == 0, err
    _same(_load(tmp_path / "s3.safetensors"), made["final"]["s3"])
    # A dead save (no manifest) is reported, ignored by verify, skipped by convert.
    fs, root = fsspec.core.url_to_fs(url)
    fs.pipe_file(f"{root}/step-000009/state.pt", b"partial")
    s = _inspect(capsys, url)["steps"][0]
    assert (s["name"], s["status"]) == ("step-000009", "incomplete")
    code, text, _ = _run(capsys, "verify", url)
    assert code == 0 and "step-000009: incomplete" in text
    code, _, err = _run(capsys, "verify", f"{url}/step-000009")
    assert code == 1
    # Damage in object storage is found the same way.
    fs.pipe_file(f"{root}/step-000002/rank-00001.pt", b"x" * fs.size(f"{root}/step-000002/"
                                                                        "rank-00001.pt"))
    code, text, _ = _run(capsys, "verify", url)
    assert code == 1 and "rank-00001.pt fails its XXH3-128 checksum" in text


def test_memory_url_inspect_verify_convert(made: dict[str, Any],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    # Another process's memory:// is not visible here: upload the DDP checkpoint as a save
    # into object storage lays it out (step-N/ files, manifest, latest).
    fs = fsspec.filesystem("memory")
    url = f"memory://ck-{uuid.uuid4().hex}/run"
    root = url.removeprefix("memory://")
    src = made["base"] / "ddp"
    for p in sorted(src.rglob("*")):
        if p.is_file():
            fs.pipe_file(f"{root}/{p.relative_to(src).as_posix()}", p.read_bytes())
    s = _inspect(capsys, url)["steps"][0]
    assert (s["name"], s["status"], s["checksums"], s["strategy"]) == \
        ("step-000003", "complete", "ok", "mixed")
    assert _inspect(capsys, url)["latest"] == "step-000003"
    assert _run(capsys, "verify", url)[0] == 0
    out = f"{url}/export/model.safetensors"
    code, _, err = _run(capsys, "convert", url, out, "--dtype", "fp16")
    assert code == 0, err
    from safetensors.numpy import load

    got = load(fs.cat_file(out.removeprefix("memory://")))
    _same(got, {k: v.astype(np.float16) for k, v in made["final"]["ddp"].items()})


# --- Hugging Face -----------------------------------------------------------------------------
def test_hf_folder_loads_with_from_pretrained(made: dict[str, Any], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    from transformers import GPT2Config, GPT2LMHeadModel

    out = tmp_path / "gpt2"
    code, _, err = _run(capsys, "convert", made["base"] / "gpt2", out, "--hf", made["config"])
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    model = GPT2LMHeadModel.from_pretrained(str(out), local_files_only=True)
    got = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    want = made["final"]["gpt2"]
    assert set(want) <= set(got)
    for k, v in want.items():
        assert np.array_equal(got[k], v), k

    wrong = tmp_path / "wrong"
    GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1, n_head=2,
               architectures=["GPT2LMHeadModel"]).save_pretrained(wrong)
    code, _, err = _run(capsys, "convert", made["base"] / "gpt2", tmp_path / "w", "--hf", wrong)
    assert code == 1 and "do not fit GPT2LMHeadModel" in err and "shapes differ" in err
    code, _, err = _run(capsys, "convert", made["base"] / "gpt2", tmp_path / "w2", "--hf",
                        tmp_path)
    assert code == 1 and "expected a folder with a config.json" in err


def test_console_script_exit_codes(made: dict[str, Any], tmp_path: Path) -> None:
    """The command as a user runs it: a process of its own, its exit code."""
    bad = subprocess.run([sys.executable, "-m", "splitsync", "ckpt", "verify", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, env=clean_env())
    assert bad.returncode == 1 and "is not a checkpoint" in bad.stderr
