"""The lesson's example 3 with splitsync: `python fixed_example3_splitsync.py` on one device,
`splitsync run -n 2 fixed_example3_splitsync.py` on two processes."""

import torch
import torch.nn as nn
from torch.utils.data import TensorDataset

import splitsync


class SimpleNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, 2)

    def forward(self, x):
        return self.fc(x)


def main() -> None:
    with splitsync.init(seed=42) as run:
        model = run.model(SimpleNet())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        criterion = nn.CrossEntropyLoss()
        generator = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(64, 10, generator=generator),
                             torch.randint(0, 2, (64,), generator=generator))
        loader = run.loader(data, batch_size=4, shuffle=True)
        for epoch in run.epochs(2):
            total = torch.zeros((), device=run.device)
            for x, y in loader:
                loss = criterion(model(x), y)
                run.backward(loss)
                run.step(optimizer)
                total += loss.detach()
            run.print(f"epoch {epoch}: mean loss {run.mean(total).item() / len(loader):.4f}")
        if run.is_main:
            torch.save(run.unwrap(model).state_dict(), "simplenet.pt")


if __name__ == "__main__":
    main()
