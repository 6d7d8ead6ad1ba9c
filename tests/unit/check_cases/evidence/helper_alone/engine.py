# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""A helper module like MAE's engine_pretrain.py: the training step, imported by the script
beside it, which sets up the process group and the rank-0 print override."""
import torch


def train_one_epoch(model, data_loader, optimizer, epoch):
    for samples in data_loader:
        loss = model(samples).mean()
        loss.backward()
        optimizer.step()
    print(f"Averaged stats: epoch {epoch}")
