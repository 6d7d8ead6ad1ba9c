"""Train a tiny Hugging Face GPT-2 on generated text, with DDP or FSDP, resumable, exported.

    python examples/hf_causal_lm.py --steps 20                          # one process
    splitsync run -n 2 examples/hf_causal_lm.py --strategy ddp
    splitsync run -n 2 examples/hf_causal_lm.py --strategy fsdp --ckpt-dir ckpt \
        --export-dir gpt2-tiny      # then: GPT2LMHeadModel.from_pretrained("gpt2-tiny")

The model comes from a local ``transformers.GPT2Config`` (2 blocks, random weights) and
the text is generated here from a small grammar, read as bytes: nothing is downloaded.
Windows end at ragged lengths, padded with labels -100, as real documents do. Batches are
dicts and the model computes its own loss, ``model(**batch).loss``: the mean over the
batch's real next-token predictions. ``run.backward(loss, count=n)`` with their number
makes each optimizer step the mean over every real token of every rank
(docs/token-losses.md), and ``run.log(..., count=n)`` logs that same mean. Under
FSDP every ``GPT2Block`` is sharded on its own, then the root. With ``--ckpt-dir`` the
run saves every ``--save-every`` steps and a relaunch continues from the newest
checkpoint; ``--export-dir`` writes ``model.safetensors`` and ``config.json``, a folder
that ``from_pretrained`` loads.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import torch
from torch.utils.data import Dataset

import splitsync as ss

WORDS = {
    "det": ["the", "a", "one", "every"],
    "noun": ["cat", "dog", "rank", "model", "tensor", "gradient", "batch", "node"],
    "verb": ["sees", "syncs", "follows", "reduces", "shards", "loads", "waits for"],
    "adj": ["small", "quick", "idle", "steady", "sharded", "fast"],
}


def make_text(n_sentences: int, seed: int) -> str:
    """Sentences like "the quick rank syncs a batch." from a seeded generator."""
    rng = random.Random(seed)
    out = []
    for _ in range(n_sentences):
        subject = f"{rng.choice(WORDS['det'])} {rng.choice(WORDS['adj'])} {rng.choice(WORDS['noun'])}"
        obj = f"{rng.choice(WORDS['det'])} {rng.choice(WORDS['noun'])}"
        out.append(f"{subject} {rng.choice(WORDS['verb'])} {obj}.")
    return " ".join(out)


IGNORE = -100  # the label Hugging Face's losses skip


class ByteWindows(Dataset):
    """Windows of the text's bytes as ``{"input_ids", "labels"}`` dicts; with ``ragged``,
    each ends at a seeded length from a quarter to all of ``seq_len`` (padding after it:
    input byte 0, label -100)."""

    def __init__(self, text: str, seq_len: int, ragged: bool = False, seed: int = 0) -> None:
        data = torch.tensor(list(text.encode()), dtype=torch.long)
        n = len(data) // seq_len
        self.windows = data[: n * seq_len].view(n, seq_len)
        g = torch.Generator().manual_seed(seed)
        self.lengths = (torch.randint(seq_len // 4, seq_len + 1, (n,), generator=g) if ragged
                        else torch.full((n,), seq_len))

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        real = torch.arange(len(self.windows[i])) < self.lengths[i]
        ids = torch.where(real, self.windows[i], 0)
        labels = torch.where(real, self.windows[i], IGNORE)
        return {"input_ids": ids, "labels": labels}  # the model shifts the labels itself


def predicted(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """How many next tokens ``model(**batch).loss`` averages over: the labels after the
    first of each row (the model shifts them) that are not -100."""
    return (batch["labels"][:, 1:] != IGNORE).sum()


def tiny_gpt2(seq_len: int):
    """A 2-block GPT-2 over bytes, random weights, dropout off."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=256, n_positions=seq_len, n_embd=64, n_layer=2, n_head=4,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # what GPT-2 uses; said here, transformers does not guess
    return model


def eval_batch(seq_len: int, n: int = 8) -> dict[str, torch.Tensor]:
    """A held-out batch (another seed), the same on every rank and in the tests."""
    windows = ByteWindows(make_text(200, seed=12345), seq_len).windows[:n]
    return {"input_ids": windows, "labels": windows}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--strategy", choices=("auto", "ddp", "fsdp"), default="auto")
    p.add_argument("--steps", type=int, default=30, help="optimizer steps in all")
    p.add_argument("--batch-size", type=int, default=8, help="per process")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=2)
    p.add_argument("--ckpt-dir", default=None, help="save here and resume from here")
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--export-dir", default=None, help="write a from_pretrained folder here")
    p.add_argument("--run-dir", default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> float:
    args = parse_args(argv)
    with ss.init(seed=args.seed, strategy=args.strategy, run_dir=args.run_dir) as run:
        train_set = ByteWindows(make_text(2000, seed=args.seed), args.seq_len, ragged=True,
                                seed=args.seed)
        model = run.model(tiny_gpt2(args.seq_len))
        blocks = run.unwrap(model).transformer.h
        sharded = sum(type(b).__name__.startswith("FSDP") for b in blocks)
        run.print(f"gpt2: {sum(p.numel() for p in model.parameters())} parameters here, "
                  f"{run.world_size} process(es), {sharded}/{len(blocks)} GPT2Block sharded")
        # After run.model: FSDP replaces the parameters the optimizer must hold.
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
        loader = run.loader(train_set, batch_size=args.batch_size, shuffle=True, drop_last=True)
        step, start_epoch = 0, 0
        if args.ckpt_dir:
            state = run.resume(args.ckpt_dir, model=model, optimizer=opt)
            step, start_epoch = state.step, state.epoch
            if state.resumed:
                run.print(f"resumed at step {step}")
        run.log_config({"model": "gpt2-tiny", "lr": args.lr, "batch_size": args.batch_size})
        epochs = args.steps // max(len(loader), 1) + 2  # enough passes for the steps asked
        for epoch in run.epochs(epochs, start=start_epoch):
            if step >= args.steps:
                break
            for batch in loader:
                loss = model(**batch).loss  # the mean over this batch's real tokens
                count = predicted(batch)
                run.backward(loss, count=count)  # the step: the mean over all ranks' tokens
                run.step(opt)
                step += 1
                if step % args.log_every == 0:
                    run.log(step=step, loss=loss.detach(), count=count)
                if args.ckpt_dir and step % args.save_every == 0:
                    run.save(step=step, epoch=epoch)
                if step >= args.steps:
                    break
        model.eval()
        with torch.no_grad():
            eval_loss = model(**run.to_device(eval_batch(args.seq_len))).loss.item()
        run.print(f"final eval loss: {eval_loss:.6f}")
        if args.export_dir:
            out = Path(args.export_dir)
            run.export(out / "model.safetensors", model)  # collective under FSDP
            if run.is_main:
                run.unwrap(model).config.save_pretrained(out)
            run.print(f"exported to {out}")
    return eval_loss


if __name__ == "__main__":
    main()
