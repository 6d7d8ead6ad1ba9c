"""Hugging Face's ``run_clm_no_trainer.py`` (causal language modelling with Accelerate),
ported to splitsync, offline.

    python examples/clm_no_trainer.py --output_dir clm-out                 # one process
    splitsync run -n 2 examples/clm_no_trainer.py --output_dir clm-out \\
        --checkpointing_steps 4 --with_tracking --report_to jsonl
    # killed? run the same command again: it continues from the newest checkpoint

With no ``--train_file`` it writes a small corpus of generated sentences under
``--output_dir``, trains a byte-level BPE tokenizer on it with ``tokenizers``, and trains a
tiny GPT-2 built from a local config: nothing is downloaded. ``--train_file``,
``--validation_file`` (txt, csv or json), ``--config_name`` and ``--tokenizer_name``
(local folders) work as in the original. ``GPT2LMHeadModel.from_pretrained(output_dir)``
loads the result.

What changed from the original, and why:

- **Offline.** ``--dataset_name``, ``--model_name_or_path`` and ``--push_to_hub`` are
  gone: they download or upload. The data are local files (generated ones by default), the
  tokenizer a BPE trained here (the original refuses to train one), the model a tiny
  config (``--config_name`` for another).
- **Accelerator → ``ss.init``.** ``Accelerator(gradient_accumulation_steps=k)`` and
  ``set_seed`` become ``ss.init(seed=..., accumulate=k)``; per-process logging setup,
  ``accelerator.state`` and the telemetry call are dropped (``run.print`` prints once).
- **prepare → ``run.model``, ``run.loader``.** The model is wrapped before the optimizer
  is built (FSDP would replace the parameters); the loaders are splitsync's, sharded per
  rank, resumable mid-epoch. ``per_device_*_batch_size`` stays per process.
- **``accelerator.accumulate`` → nothing.** Models from ``run.model`` know the window.
- **The scheduler.** Accelerate's prepared scheduler skips micro-steps by itself and steps
  ``num_processes`` times per optimizer step, so the original scaled warmup and total by
  ``gradient_accumulation_steps`` (newer copies: by ``num_processes``). Here the scheduler
  steps once per optimizer step, ``if run.step(optimizer): lr_scheduler.step()``, and
  ``--num_warmup_steps`` and ``--max_train_steps`` are optimizer steps at every world size
  and accumulation.
- **``accelerator.sync_gradients`` → what ``run.step`` returns.**
- **``main_process_first`` → ``run.main_process_first``**, around the corpus, the
  tokenizer and the ``datasets`` maps: rank 0 fills each cache, the others read it.
- **Resume.** ``save_state``/``load_state``, the folder-name arithmetic and
  ``skip_first_batches`` (about 30 lines) become ``run.resume`` at the start and
  ``run.save`` every ``--checkpointing_steps`` optimizer steps or ``epoch``: the model,
  optimizer, scheduler, RNG states and loader positions, under ``output_dir/checkpoints``
  (``--resume_from_checkpoint DIR`` for another), the newest ``--keep_checkpoints`` (3)
  kept. Resuming is automatic and bit-exact at the same world size; at another one it
  trains each remaining sample of the epoch once. The original also saved on every
  micro-step of a step that hit ``checkpointing_steps``; here once per step.
- **Evaluation.** ``gather_for_metrics(loss.repeat(per_device_eval_batch_size))``
  repeated the loss of a short last batch too often; here by the batch's own size.
- **Trackers → ``run.log``.** ``--report_to`` names splitsync's trackers (``jsonl``,
  ``csv``, ``tensorboard``, ``wandb``, ``mlflow``, or ``all``), written under
  ``--output_dir``. ``run.log`` is a collective and averages over ranks; every
  ``--logging_steps`` optimizer steps it records the training loss and learning rate
  (the original recorded an epoch's mean training loss only).
- **``save_pretrained`` → ``run.export``** plus the config's and tokenizer's
  ``save_pretrained`` (tied weights written once, as ``save_pretrained`` does).
- The three training samples the original logs are drawn from a generator of their own,
  so logging does not change the run's random draws.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from itertools import chain
from pathlib import Path
from typing import Any

import torch

import splitsync as ss

WORDS = {
    "det": ["the", "a", "one", "every", "no"],
    "adj": ["small", "quick", "idle", "steady", "sharded", "fast", "late"],
    "noun": ["cat", "rank", "model", "tensor", "gradient", "batch", "node", "loader"],
    "verb": ["sees", "syncs", "follows", "reduces", "shards", "loads", "waits for", "saves"],
}


def write_corpus(path: Path, lines: int, seed: int) -> None:
    """Sentences like "the quick rank syncs a batch." from a seeded generator, a few a line."""
    rng = random.Random(seed)

    def sentence() -> str:
        return (f"{rng.choice(WORDS['det'])} {rng.choice(WORDS['adj'])} "
                f"{rng.choice(WORDS['noun'])} {rng.choice(WORDS['verb'])} "
                f"{rng.choice(WORDS['det'])} {rng.choice(WORDS['noun'])}.")

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(" ".join(sentence() for _ in range(rng.randint(1, 4)))
                              for _ in range(lines)) + "\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--train_file", default=None, help="a csv, json or txt file")
    p.add_argument("--validation_file", default=None, help="a csv, json or txt file")
    p.add_argument("--validation_split_percentage", type=int, default=5)
    p.add_argument("--config_name", default=None, help="a local folder with config.json")
    p.add_argument("--tokenizer_name", default=None, help="a local tokenizer folder")
    p.add_argument("--vocab_size", type=int, default=512, help="of the BPE trained here")
    p.add_argument("--per_device_train_batch_size", type=int, default=8)
    p.add_argument("--per_device_eval_batch_size", type=int, default=8)
    p.add_argument("--learning_rate", type=float, default=5e-4)
    p.add_argument("--weight_decay", type=float, default=0.0)
    p.add_argument("--num_train_epochs", type=int, default=2)
    p.add_argument("--max_train_steps", type=int, default=None)
    p.add_argument("--gradient_accumulation_steps", type=int, default=1)
    p.add_argument("--lr_scheduler_type", default="linear")
    p.add_argument("--num_warmup_steps", type=int, default=0, help="in optimizer steps")
    p.add_argument("--output_dir", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block_size", type=int, default=64)
    p.add_argument("--preprocessing_num_workers", type=int, default=None)
    p.add_argument("--overwrite_cache", action="store_true")
    p.add_argument("--no_keep_linebreaks", action="store_true")
    p.add_argument("--checkpointing_steps", default=None, help="N optimizer steps, or 'epoch'")
    p.add_argument("--resume_from_checkpoint", default=None, help="checkpoint folder")
    p.add_argument("--keep_checkpoints", type=int, default=3)
    p.add_argument("--with_tracking", action="store_true")
    p.add_argument("--report_to", default="all")
    p.add_argument("--logging_steps", type=int, default=10)
    args = p.parse_args(argv)
    for f in (args.train_file, args.validation_file):
        if f is not None and f.rsplit(".", 1)[-1] not in ("csv", "json", "txt"):
            raise ValueError(f"{f}: give a csv, json or txt file.")
    return args


def load_text(args: argparse.Namespace, out: Path) -> Any:
    """Raw train and validation splits (``datasets``), from the files given or a corpus
    written here; the split of a validation share happens as in the original."""
    from datasets import load_dataset

    if args.train_file is None:
        args.train_file = str(out / "data" / "train.txt")
        if not Path(args.train_file).exists():  # rank 0 writes it (main_process_first)
            write_corpus(Path(args.train_file), 1200, args.seed)
    files = {"train": args.train_file}
    if args.validation_file is not None:
        files["validation"] = args.validation_file
    kind = args.train_file.rsplit(".", 1)[-1]
    extra = {"keep_linebreaks": not args.no_keep_linebreaks} if kind == "txt" else {}
    kind = "text" if kind == "txt" else kind
    common = {"data_files": files, "cache_dir": str(out / "hf-cache"), **extra}
    raw = load_dataset(kind, **common)
    if "validation" not in raw:
        pct = args.validation_split_percentage
        raw["validation"] = load_dataset(kind, split=f"train[:{pct}%]", **common)
        raw["train"] = load_dataset(kind, split=f"train[{pct}%:]", **common)
    return raw


def load_tokenizer(args: argparse.Namespace, out: Path, train_file: str) -> Any:
    """``--tokenizer_name``, or a byte-level BPE trained on the training file once (rank 0,
    inside main_process_first) and read back by every rank from ``output_dir/tokenizer``."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    folder = Path(args.tokenizer_name) if args.tokenizer_name else out / "tokenizer"
    if not (folder / "tokenizer.json").exists() and not args.tokenizer_name:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        bpe = Tokenizer(models.BPE())
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.decoder = decoders.ByteLevel()
        bpe.train([train_file], trainers.BpeTrainer(
            vocab_size=args.vocab_size, special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
        PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|endoftext|>",
                                eos_token="<|endoftext|>").save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def build_model(args: argparse.Namespace, tokenizer: Any) -> Any:
    """From ``--config_name``, or a 2-block GPT-2 sized for the tokenizer (random weights)."""
    from transformers import AutoConfig, AutoModelForCausalLM, GPT2Config

    if args.config_name:
        config = AutoConfig.from_pretrained(args.config_name, local_files_only=True)
    else:
        config = GPT2Config(vocab_size=len(tokenizer), n_positions=args.block_size, n_embd=64,
                            n_layer=2, n_head=4, bos_token_id=tokenizer.bos_token_id,
                            eos_token_id=tokenizer.eos_token_id)
    model = AutoModelForCausalLM.from_config(config)  # seeded alike on every rank by init
    model.loss_type = "ForCausalLM"  # what the config means; said, not guessed with a warning
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer))
    return model


def lm_datasets(run: ss.Run, args: argparse.Namespace, raw: Any, tokenizer: Any,
                block_size: int) -> Any:
    """Tokenize, then concatenate and cut into ``block_size`` chunks, as the original."""
    column = "text" if "text" in raw["train"].column_names else raw["train"].column_names[0]

    def group_texts(examples: dict[str, list[Any]]) -> dict[str, list[Any]]:
        joined = {k: list(chain(*examples[k])) for k in examples}
        total = (len(joined[next(iter(examples))]) // block_size) * block_size
        result = {k: [t[i: i + block_size] for i in range(0, total, block_size)]
                  for k, t in joined.items()}
        result["labels"] = result["input_ids"].copy()
        return result

    with run.main_process_first():  # rank 0 fills the datasets cache; the others read it
        tokenized = raw.map(lambda ex: tokenizer(ex[column]), batched=True,
                            num_proc=args.preprocessing_num_workers,
                            remove_columns=raw["train"].column_names,
                            load_from_cache_file=not args.overwrite_cache,
                            desc="Running tokenizer on dataset")
        return tokenized.map(group_texts, batched=True, num_proc=args.preprocessing_num_workers,
                             load_from_cache_file=not args.overwrite_cache,
                             desc=f"Grouping texts in chunks of {block_size}")


def evaluate(run: ss.Run, model: Any, eval_dl: Any) -> tuple[float, float]:
    """Mean loss over every validation block once (the sampler's padding dropped)."""
    model.eval()
    losses = []
    with torch.no_grad():
        for batch in eval_dl:
            loss = model(**batch).loss
            losses.append(run.gather_for_metrics(loss.repeat(len(batch["input_ids"]))))
    eval_loss = torch.cat(losses).mean().item()
    try:
        perplexity = math.exp(eval_loss)
    except OverflowError:
        perplexity = float("inf")
    return eval_loss, perplexity


def main(argv: list[str] | None = None) -> float:
    args = parse_args(argv)
    out = Path(args.output_dir)
    loggers = None if args.report_to == "all" else [args.report_to]
    with ss.init(seed=args.seed, accumulate=args.gradient_accumulation_steps,
                 run_dir=str(out) if args.with_tracking else None, loggers=loggers) as run:
        from transformers import default_data_collator, get_scheduler

        with run.main_process_first():  # the corpus and the tokenizer, made once
            raw = load_text(args, out)
            tokenizer = load_tokenizer(args, out, args.train_file)
        model = build_model(args, tokenizer)
        block_size = min(args.block_size, model.config.max_position_embeddings)
        data = lm_datasets(run, args, raw, tokenizer, block_size)
        train_dataset, eval_dataset = data["train"], data["validation"]
        pick = random.Random(args.seed)  # not the run's generators: logging changes nothing
        for index in pick.sample(range(len(train_dataset)), 3):
            run.print(f"Sample {index} of the training set: "
                      f"{tokenizer.decode(train_dataset[index]['input_ids'][:24])!r}...")

        model = run.model(model)  # the device, DDP at several processes
        train_dl = run.loader(train_dataset, batch_size=args.per_device_train_batch_size,
                              shuffle=True, collate_fn=default_data_collator)
        eval_dl = run.loader(eval_dataset, batch_size=args.per_device_eval_batch_size,
                             collate_fn=default_data_collator)
        no_decay = ["bias", "layer_norm.weight", "ln_1.weight", "ln_2.weight", "ln_f.weight"]
        named = list(model.named_parameters())  # after run.model: the parameters it trains
        optimizer = torch.optim.AdamW([
            {"params": [p for n, p in named if not any(nd in n for nd in no_decay)],
             "weight_decay": args.weight_decay},
            {"params": [p for n, p in named if any(nd in n for nd in no_decay)],
             "weight_decay": 0.0}], lr=args.learning_rate)
        steps_per_epoch = math.ceil(len(train_dl) / args.gradient_accumulation_steps)
        if args.max_train_steps is None:
            args.max_train_steps = args.num_train_epochs * steps_per_epoch
        epochs = math.ceil(args.max_train_steps / steps_per_epoch)
        lr_scheduler = get_scheduler(args.lr_scheduler_type, optimizer=optimizer,
                                     num_warmup_steps=args.num_warmup_steps,
                                     num_training_steps=args.max_train_steps)

        checkpoints = args.resume_from_checkpoint or str(out / "checkpoints")
        state = run.resume(checkpoints, model=model, optimizer=optimizer,
                           lr_scheduler=lr_scheduler, keep=args.keep_checkpoints)
        every = args.checkpointing_steps
        every = int(every) if every is not None and every.isdigit() else every
        run.log_config(vars(args))
        run.print(f"{len(train_dataset)} training blocks of {block_size} tokens, "
                  f"{run.world_size} process(es), {args.per_device_train_batch_size} x "
                  f"{args.gradient_accumulation_steps} x {run.world_size} per step, "
                  f"{args.max_train_steps} steps" + (f", resuming at step {state.step}"
                                                     if state.resumed else ""))

        completed_steps, perplexity = state.step, float("nan")
        for epoch in run.epochs(epochs, start=state.epoch):
            model.train()
            for batch in run.progress(train_dl, desc=f"epoch {epoch}"):
                if completed_steps >= args.max_train_steps:
                    break
                loss = model(**batch).loss
                run.backward(loss)
                if not run.step(optimizer):  # a micro-step: the optimizer did not step
                    continue
                lr_scheduler.step()
                completed_steps += 1
                if args.logging_steps and completed_steps % args.logging_steps == 0:
                    run.log(step=completed_steps, train_loss=loss.detach(),
                            lr=lr_scheduler.get_last_lr()[0])
                if isinstance(every, int) and completed_steps % every == 0:
                    run.save(checkpoints)
            eval_loss, perplexity = evaluate(run, model, eval_dl)
            run.log(step=completed_steps, epoch=epoch, eval_loss=eval_loss,
                    perplexity=perplexity)
            if every == "epoch":
                run.save(checkpoints)
        run.export(out / "model.safetensors")  # every rank: FSDP would gather here
        if run.is_main:
            run.unwrap(model).config.save_pretrained(out)
            tokenizer.save_pretrained(out)
            (out / "all_results.json").write_text(json.dumps({"perplexity": perplexity}))
        run.print(f"perplexity {perplexity!r} after {completed_steps} steps")
    return perplexity


if __name__ == "__main__":
    main()
