"""Train a small character-level language model from streamed text files, on one process or many.

    python examples/stream.py                       # one process
    splitsync run -n 2 examples/stream.py           # two processes, DDP
    splitsync run -n 2 examples/stream.py --ckpt-dir ckpt   # resumable: rerun to continue

The text is generated locally (nothing is downloaded) as several files and read through
Hugging Face ``datasets`` in streaming mode. ``run.loader`` deals the files (shards) out to the
ranks and workers, and ``run.save``/``run.resume`` record the position in the stream, so an
interrupted run continues with exactly the lines it had not trained on, at any world size.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import splitsync as ss

SEQ = 48  # characters per training line (shorter lines are padded, longer cut)
VOCAB = 128  # ASCII
PAD = 0

SUBJECTS = ["the cat", "a dog", "my friend", "the robot", "our teacher", "a small bird"]
VERBS = ["sees", "likes", "finds", "paints", "follows", "carries"]
OBJECTS = ["the ball", "a red hat", "the old map", "some bread", "a blue kite", "the moon"]
PLACES = ["in the park", "at home", "by the sea", "on the hill", "under a tree", "at noon"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32, help="per process")
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--files", type=int, default=8, help="training shards to generate")
    p.add_argument("--lines", type=int, default=400, help="lines per training file")
    p.add_argument("--workers", type=int, default=0, help="DataLoader workers per process")
    p.add_argument("--data-dir", default=None, help="where to write the text (default: temp)")
    p.add_argument("--ckpt-dir", default=None, help="save each epoch here; resume from it")
    p.add_argument("--run-dir", default=None, help="write metrics.jsonl/.csv here")
    return p.parse_args(argv)


def write_corpus(root: Path, files: int, lines: int, seed: int) -> tuple[list[str], list[str]]:
    """Simple sentences from a tiny grammar, ``files`` training files and one validation file."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)

    def sentence() -> str:
        return (f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} "
                f"{rng.choice(PLACES)}.")

    train = []
    for i in range(files):
        f = root / f"train-{i:03d}.txt"
        f.write_text("".join(sentence() + "\n" for _ in range(lines)))
        train.append(str(f))
    val = root / "val-000.txt"
    val.write_text("".join(sentence() + "\n" for _ in range(lines)))
    return train, [str(val)]


def encode(batch: list[dict[str, str]]) -> torch.Tensor:
    """Lines to (B, SEQ) ASCII codes, padded with 0: inputs are [:, :-1], targets [:, 1:]."""
    out = torch.full((len(batch), SEQ), PAD, dtype=torch.long)
    for i, row in enumerate(batch):
        codes = [min(ord(c), VOCAB - 1) for c in row["text"][:SEQ]]
        out[i, : len(codes)] = torch.tensor(codes, dtype=torch.long)
    return out


class CharLM(nn.Module):
    """Embedding, one GRU layer and a linear head: about 80k parameters."""

    def __init__(self, dim: int = 64, hidden: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.rnn = nn.GRU(dim, hidden, batch_first=True)
        self.head = nn.Linear(hidden, VOCAB)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(codes))
        return self.head(out)


def lm_loss(model: nn.Module, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean loss over real characters, their count): padding is never a target."""
    logits = model(codes[:, :-1])
    target = codes[:, 1:]
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1), ignore_index=PAD,
                           reduction="sum")
    count = (target != PAD).sum()
    return loss / count.clamp(min=1), count


def evaluate(run: ss.Run, model: nn.Module, val: Iterable[torch.Tensor]) -> float:
    """Validation loss in nats per character, over every line exactly once."""
    model.eval()
    total = torch.zeros((), device=run.device)
    chars = torch.zeros((), device=run.device)
    with torch.no_grad():
        for codes in val:
            loss, count = lm_loss(model, codes)
            total += loss * count
            chars += count
    model.train()
    return float(run.sum(total)) / max(float(run.sum(chars)), 1.0)


def main(argv: list[str] | None = None) -> float:
    args = parse_args(argv)
    from datasets import load_dataset

    with ss.init(seed=args.seed, run_dir=args.run_dir) as run:
        with tempfile.TemporaryDirectory() as tmp:
            # A shared --data-dir gets one writer; temporary directories are per process,
            # and each process writes the same (seeded) text into its own.
            root = Path(args.data_dir or tmp) / "corpus"
            if run.is_main or not args.data_dir:
                write_corpus(root, args.files, args.lines, args.seed)
            run.barrier()
            train_files = sorted(str(p) for p in root.glob("train-*.txt"))
            val_files = [str(root / "val-000.txt")]
            stream = load_dataset("text", data_files=train_files, split="train", streaming=True)
            run.print(f"stream: {len(train_files)} text files x {args.lines} lines, "
                      f"{run.world_size} process(es) on {run.device}, batch {args.batch_size} "
                      "per process")
            model = run.model(CharLM())
            opt = torch.optim.Adam(model.parameters(), lr=args.lr)
            loader = run.loader(stream, batch_size=args.batch_size, shuffle=True,
                                num_workers=args.workers, collate_fn=encode)
            # at_end="uneven": evaluation has no collective per batch, so no rank waits on
            # another and every validation line counts once.
            val = run.loader(load_dataset("text", data_files=val_files, split="train",
                                          streaming=True),
                             batch_size=128, collate_fn=encode, at_end="uneven")
            start_epoch = 0
            if args.ckpt_dir:
                state = run.resume(args.ckpt_dir, model=model, optimizer=opt)
                start_epoch = state.epoch
                if state.resumed:
                    run.print(f"resumed from {state.path} at epoch {state.epoch}")
            val_loss = float("nan")
            for epoch in run.epochs(args.epochs, start=start_epoch):
                t0 = time.perf_counter()
                seen = steps = 0
                loss_sum = torch.zeros((), device=run.device)
                for codes in run.progress(loader, desc=f"epoch {epoch + 1}/{args.epochs}"):
                    loss, _ = lm_loss(model, codes)
                    run.backward(loss)
                    run.step(opt)
                    loss_sum += loss.detach()
                    seen += len(codes)
                    steps += 1
                # Lines/s over all ranks: every rank's count, over the slowest rank's time.
                elapsed = run.max(time.perf_counter() - t0)
                lines_per_s = run.sum(seen) / elapsed
                val_loss = evaluate(run, model, val)
                run.log(epoch=epoch + 1, loss=loss_sum / max(steps, 1), val_loss=val_loss,
                        lines_per_s=lines_per_s)
                if args.ckpt_dir:
                    run.save(args.ckpt_dir)
            run.barrier()  # nobody removes the temporary corpus while another rank reads it
        run.print(f"validation loss: {val_loss:.3f} nats/char")
    return val_loss


if __name__ == "__main__":
    main()
