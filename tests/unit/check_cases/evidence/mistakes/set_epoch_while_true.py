# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""rosinality's stylegan2 idiom: an endless `sample_data` generator loops over the loader
forever, and nothing ever calls `sampler.set_epoch`."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils import data


def data_sampler(dataset, shuffle, distributed):
    if distributed:
        return data.distributed.DistributedSampler(dataset, shuffle=shuffle)
    return data.RandomSampler(dataset)


def sample_data(loader):
    while True:
        for batch in loader:
            yield batch


def train(loader, generator, g_optim, iters):
    loader = sample_data(loader)
    for idx in range(iters):
        real_img = next(loader)
        generator(real_img).mean().backward()
        g_optim.step()


if __name__ == "__main__":
    dist.init_process_group(backend="gloo")
    torch.manual_seed(0)
    dataset = data.TensorDataset(torch.randn(64, 4))
    loader = data.DataLoader(dataset, batch_size=8,
                             sampler=data_sampler(dataset, shuffle=True, distributed=True))
    generator = DDP(torch.nn.Linear(4, 4))
    train(loader, generator, torch.optim.Adam(generator.parameters()), 100)
