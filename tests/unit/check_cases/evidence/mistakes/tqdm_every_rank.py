# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""llama-recipes' train_utils idiom: the training progress bar is created on every rank."""
import torch
import torch.distributed as dist
from tqdm import tqdm


def train(model, train_dataloader, optimizer, epochs):
    for epoch in range(epochs):
        pbar = tqdm(colour="blue", desc=f"Training Epoch: {epoch + 1}", total=len(train_dataloader))
        for batch in train_dataloader:
            model(batch).sum().backward()
            optimizer.step()
            pbar.update(1)
        pbar.close()


if __name__ == "__main__":
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    train(model, [torch.randn(2, 4)], torch.optim.SGD(model.parameters(), lr=0.1), 2)
