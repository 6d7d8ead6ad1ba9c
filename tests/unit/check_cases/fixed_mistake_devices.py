"""The lesson's device-mismatch mistake, fixed: model and input on the same device variable."""

import torch
import torch.nn as nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Linear(10, 2).to(device)
input_gpu = torch.randn(2, 10).to(device)
output = model(input_gpu)
