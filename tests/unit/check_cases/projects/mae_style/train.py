"""Entry point: the set-up, the sampler's epoch and the print override live in other modules."""
import argparse

import torch
from engine import one_epoch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from utils import misc


def scaler_step(loss, optimizer, update_grad):
    loss.backward()
    if update_grad:
        optimizer.step()
        optimizer.zero_grad()


def main(args):
    misc.start_distributed(args)
    torch.manual_seed(args.seed)
    data = TensorDataset(torch.arange(64.0).reshape(32, 2), torch.zeros(32))
    loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data, shuffle=True))
    model = DDP(torch.nn.Linear(2, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    print("training", model)
    for epoch in range(args.epochs):
        one_epoch(model, loader, optimizer, scaler_step, epoch, args.accum)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--accum", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    main(parser.parse_args())
