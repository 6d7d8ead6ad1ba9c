# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""The idiom of small DDP ImageNet trainers (tae-mo/DDP-ImageNet-pytorch): a helper builds the
train and validation loaders, both with a DistributedSampler; `valid()` sums accuracy over its
loader and returns it; rank 0 prints it and keeps the "best" checkpoint by it. Rank 0 sees one
shard of the validation set, so the printed accuracy is that shard's, not the model's."""
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def prepare_dataset(rank, world_size, args):
    train_dataset = TensorDataset(torch.randn(512, 8), torch.randint(0, 4, (512,)))
    train_sampler = DistributedSampler(train_dataset, num_replicas=world_size, rank=rank,
                                       shuffle=True)
    train_dataloader = DataLoader(train_dataset, batch_size=args.batch_size,
                                  sampler=train_sampler)
    val_dataset = TensorDataset(torch.randn(128, 8), torch.randint(0, 4, (128,)))
    val_sampler = DistributedSampler(val_dataset, num_replicas=world_size, rank=rank,
                                     shuffle=False)
    val_dataloader = DataLoader(val_dataset, batch_size=args.batch_size, sampler=val_sampler)
    return train_dataloader, val_dataloader


def train(model, train_loader, criterion, optimizer, rank, args):
    model.train()
    for img, label in train_loader:
        loss = criterion(model(img), label)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def valid(model, val_loader, criterion, rank, args):
    model.eval()
    total_loss, total_acc = 0, 0
    with torch.no_grad():
        for img, label in val_loader:
            out = model(img)
            loss = criterion(out, label)
            total_acc += (out.argmax(-1) == label).float().sum() / args.batch_size
            total_loss += loss.item()
        return total_acc / len(val_loader), total_loss / len(val_loader)


def main(rank, world_size, args):
    setup(rank, world_size)
    train_loader, val_loader = prepare_dataset(rank, world_size, args)
    model = DDP(nn.Linear(8, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    criterion = nn.CrossEntropyLoss()
    best_acc = 0.0
    for epoch in range(args.epochs):
        train_loader.sampler.set_epoch(epoch)
        train(model, train_loader, criterion, optimizer, rank, args)
        if rank == 0:
            epoch_acc, epoch_loss = valid(model, val_loader, criterion, rank, args)
            print(f"EPOCH {epoch}: acc = {epoch_acc}, loss = {epoch_loss}")
            if epoch_acc > best_acc:
                best_acc = epoch_acc
                torch.save(model.state_dict(), os.path.join(args.exp, "best.pth"))
    dist.destroy_process_group()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--exp", default="./exp")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    world_size = 2
    mp.spawn(main, args=(world_size, args), nprocs=world_size)
