# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""The test loop of Lightning's image-classifier example, as issue 33 describes it: the test
loader is sharded by `setup_dataloaders` (a padding DistributedSampler), the summed loss is
divided by `len(test_loader.dataset)` (359 images, 360 evaluated)."""
import torch
import torch.nn.functional as F
from lightning.fabric import Fabric


def run(train_set, test_set):
    fabric = Fabric()
    model = torch.nn.Linear(4, 2)
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=64)
    test_loader = torch.utils.data.DataLoader(test_set, batch_size=64)
    model = fabric.setup(model)
    train_loader, test_loader = fabric.setup_dataloaders(train_loader, test_loader)
    model.eval()
    test_loss = 0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
    test_loss = fabric.all_gather(test_loss).sum() / len(test_loader.dataset)
    fabric.print(f"Test set: Average loss: {test_loss:.4f}")
