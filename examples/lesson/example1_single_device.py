"""Example 1: train SimpleNet on one device (a GPU if there is one, else the CPU).

The lesson takes a single step; here the loop runs a few steps so the loss visibly falls.
"""

from __future__ import annotations

import torch
from simplenet import SimpleNet, toy_data
from torch import nn, optim


def main(steps: int = 50) -> tuple[float, float]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"device: {device}")
    torch.manual_seed(0)

    model = SimpleNet().to(device)            # model parameters on the device ...
    x, y = toy_data(64)
    x, y = x.to(device), y.to(device)         # ... and the data on the same device
    criterion = nn.CrossEntropyLoss()
    optimizer = optim.SGD(model.parameters(), lr=0.5)

    losses = []
    for _ in range(steps):
        optimizer.zero_grad()                 # clear last step's gradients
        loss = criterion(model(x), y)         # forward on the device
        loss.backward()                       # backward
        optimizer.step()                      # update
        losses.append(loss.item())
    print(f"loss: first {losses[0]:.4f} -> last {losses[-1]:.4f}")
    return losses[0], losses[-1]


if __name__ == "__main__":
    main()
