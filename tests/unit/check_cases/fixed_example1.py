"""The lesson's example 1 (one device), portable: CUDA when there is one, else the CPU."""

import torch
import torch.nn as nn
import torch.optim as optim

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
print(f"device: {device}")


class SimpleNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, 2)

    def forward(self, x):
        return self.fc(x)


model = SimpleNet().to(device)
input_data = torch.randn(5, 10).to(device)
labels = torch.randint(0, 2, (5,)).to(device)

criterion = nn.CrossEntropyLoss()
optimizer = optim.SGD(model.parameters(), lr=0.01)

optimizer.zero_grad()
outputs = model(input_data)
loss = criterion(outputs, labels)
loss.backward()
optimizer.step()
print(f"one step done, loss: {loss.item()}")
