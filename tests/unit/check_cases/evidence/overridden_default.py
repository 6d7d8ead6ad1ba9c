# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""EDM's training_loop idiom with every call passing the device: the CUDA default of the
parameter is never used."""
import torch


def training_loop(network, batch_size=64, device=torch.device("cuda")):
    return network.to(device), batch_size


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    training_loop(torch.nn.Linear(2, 2), device=device)
    training_loop(torch.nn.Linear(3, 3), 32, device)


if __name__ == "__main__":
    main()
