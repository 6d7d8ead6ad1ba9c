# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""Apex's ImageNet example idiom: `criterion = nn.CrossEntropyLoss().cuda()`, a move of a
module that holds no tensors (it does nothing)."""
import torch
from torch import nn

criterion = nn.CrossEntropyLoss().cuda()
loss_fun = nn.MSELoss().cuda()
