"""``splitsync ckpt`` pieces in one process: kinds, paths, writers, and a one-rank round trip."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import torch
from torch import nn

import splitsync as ss
from splitsync.ckpt.offline.convert import _strip, pick_model, pick_optimizer
from splitsync.ckpt.offline.reading import locate
from splitsync.ckpt.offline.writers import write_optimizer, write_safetensors
from splitsync.ckpt.state import kind_from_state, kind_of, type_name
from splitsync.cli import main as cli
from splitsync.errors import CheckpointError


class ModelEmaV3:
    """Shaped like timm's EMA: not a module, a state dict of tensors."""

    def state_dict(self) -> dict:
        return {"shadow": {"w": torch.ones(2)}}


class Schema:
    def state_dict(self) -> dict:
        return {}


def test_kinds_of_registered_objects() -> None:
    from torch.optim.swa_utils import AveragedModel

    net = nn.Linear(2, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    assert type_name(AveragedModel(net)) == "torch.optim.swa_utils.AveragedModel"
    assert type_name(torch.nn.parallel.DataParallel(net)) == "torch.nn.modules.linear.Linear"
    assert [kind_of(o) for o in (net, AveragedModel(net), opt, torch.amp.GradScaler("cpu"),
                                 torch.optim.lr_scheduler.StepLR(opt, 1), ModelEmaV3(),
                                 Schema())] == \
        ["model", "ema", "optimizer", "scaler", "scheduler", "ema", "object"]
    assert kind_of(nn.Linear(2, 2), "ema") == "ema"  # a deep copy registered as ema=
    assert kind_of(opt, "ema_opt") == "optimizer"
    # Manifests written before kinds were recorded: from the state's keys.
    assert kind_from_state("s", None, {"last_epoch": 1, "base_lrs": [0.1]}) == "scheduler"
    assert kind_from_state("g", None, {"scale": 1.0, "growth_factor": 2.0}) == "scaler"
    assert kind_from_state("ema", None, {}) == "ema"
    assert kind_from_state("schema", None, {}) == "object"


def test_paths_that_are_not_checkpoints(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    (tmp_path / "d" / "logs").mkdir(parents=True)
    for bad, says in ((tmp_path / "missing", "no such directory"), (tmp_path / "f", "is a file"),
                      (tmp_path / "d", "is not a checkpoint: it holds no step-NNNNNN/")):
        with pytest.raises(CheckpointError, match="expected a checkpoint directory") as e:
            locate(bad)
        assert str(bad) in str(e.value) and says in str(e.value)
    with pytest.raises(CheckpointError, match="nothing there"):
        locate(f"memory://nothing-{uuid.uuid4().hex}/run")


def test_choosing_model_and_optimizer() -> None:
    body = {"models": ["ema", "net"], "optimizers": {"opt": "net"}, "objects": []}
    assert pick_model(body, None, "w") == "net"  # the one the optimizer trains
    assert pick_optimizer(body, "net", None, "w") == "opt"
    with pytest.raises(CheckpointError, match="no optimizer state for model 'ema'"):
        pick_optimizer(body, "ema", None, "w")
    two = {"models": ["a", "b"], "optimizers": {"oa": "a", "ob": "b"}, "objects": []}
    with pytest.raises(CheckpointError, match="several models .* --model NAME"):
        pick_model(two, None, "w")
    assert _strip({"m.a": torch.ones(1)}, "m.", "w").keys() == {"a"}
    with pytest.raises(CheckpointError, match="does not begin every parameter name"):
        _strip({"m.a": torch.ones(1), "b": torch.ones(1)}, "m.", "w")


def test_writers_tied_weights_urls_and_optimizer(tmp_path: Path) -> None:
    from safetensors.torch import load, load_file

    w = torch.randn(4, 3)
    out = write_safetensors({"emb": w, "head": w}, str(tmp_path / "t.safetensors"),
                            {"format": "pt"})
    got = load_file(out)
    assert torch.equal(got["emb"], w) and torch.equal(got["head"], w)
    assert not list(tmp_path.glob("*.part"))
    url = f"memory://w-{uuid.uuid4().hex}/a/b.safetensors"
    write_safetensors({"x": torch.arange(3)}, url, {"format": "pt"})
    import fsspec

    assert torch.equal(load(fsspec.open(url, "rb").open().read())["x"], torch.arange(3))
    osd = {"state": {"m.w": {"exp_avg": torch.ones(2), "step": torch.tensor(3.0)}},
           "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99), "params": ["m.w"]}]}
    back = torch.load(write_optimizer(osd, str(tmp_path / "o.pt"), "m."), weights_only=True)
    assert back["param_groups"][0]["params"] == ["w"] and torch.equal(
        back["state"]["w"]["exp_avg"], torch.ones(2))
    with pytest.raises(CheckpointError, match="is a directory"):
        write_safetensors({"x": torch.ones(1)}, str(tmp_path), {})


def test_one_rank_checkpoint_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.torch import load_file

    with ss.init(seed=0) as run:
        torch.manual_seed(0)
        model = run.model(nn.Linear(4, 3))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        run.resume(tmp_path / "ck", model=model, optimizer=opt)
        run.backward(model(torch.randn(2, 4)).sum())
        run.step(opt)
        run.save()
        want = {k: v.detach().clone() for k, v in model.state_dict().items()}
    assert cli(["ckpt", "verify", str(tmp_path / "ck"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and [s["name"] for s in report["steps"]] == ["step-000001"]
    assert cli(["ckpt", "inspect", str(tmp_path / "ck" / "step-000001"), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)["steps"][0]
    assert (s["strategy"], s["world_size"], s["holds"]["model"]["model"]["elements"]) == \
        ("single", 1, 15)
    assert cli(["ckpt", "convert", str(tmp_path / "ck"), str(tmp_path / "w.safetensors")]) == 0
    got = load_file(tmp_path / "w.safetensors")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)

    # --quick reads manifests and sizes only: a flipped bit goes unseen there, not otherwise.
    capsys.readouterr()
    state = tmp_path / "ck" / "step-000001" / "state.pt"
    data = bytearray(state.read_bytes())
    data[-40] ^= 1
    state.write_bytes(data)
    assert cli(["ckpt", "inspect", str(tmp_path / "ck"), "--quick", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)["steps"][0]
    assert (s["status"], s["checksums"]) == ("complete", "not checked")
    assert s["holds"]["model"] == {"model": {"type": "torch.nn.modules.linear.Linear"}}
    assert cli(["ckpt", "inspect", str(tmp_path / "ck"), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)["steps"][0]
    assert (s["status"], s["checksums"]) == ("damaged", "failed")
    assert s["problems"] == ["state.pt fails its XXH3-128 checksum (corrupted)"]
