"""Exercise 1: detect a GPU; create a (3, 4) tensor and move it there.

    python examples/lesson/exercise1_device.py     ->  tensor device: cuda:0  (or cpu)
"""

from __future__ import annotations

import torch


def pick_device() -> torch.device:
    # The lesson checks CUDA only; Apple (mps) and Intel (xpu) GPUs are asked the same way.
    if torch.cuda.is_available():
        return torch.device("cuda", 0)
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def main() -> torch.Tensor:
    device = pick_device()
    t = torch.randn(3, 4).to(device)  # .to(device), never .cuda(): works on every machine
    print(f"tensor device: {t.device}")
    print(f"tensor shape: {tuple(t.shape)}")
    return t


if __name__ == "__main__":
    main()
