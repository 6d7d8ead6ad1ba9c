# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""The idiom of PyTorch's ImageNet example: the validation loader is sharded by a
DistributedSampler (shuffle=False, drop_last=True), the accuracy meters accumulate each
batch, and `top1.all_reduce()` sums the meters across ranks before the result is printed."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class AverageMeter:
    def __init__(self, name):
        self.name = name
        self.sum = 0.0
        self.count = 0

    def update(self, val, n=1):
        self.sum += val * n
        self.count += n

    def all_reduce(self):
        total = torch.tensor([self.sum, self.count], dtype=torch.float32)
        dist.all_reduce(total, dist.ReduceOp.SUM, async_op=False)
        self.sum, self.count = total.tolist()

    @property
    def avg(self):
        return self.sum / max(self.count, 1)


def accuracy(output, target):
    return (output.argmax(1) == target).float().mean() * 100


def validate(val_loader, model, criterion, args):
    top1 = AverageMeter("Acc@1")
    model.eval()
    with torch.no_grad():
        for images, target in val_loader:
            output = model(images)
            top1.update(accuracy(output, target).item(), images.size(0))
    top1.all_reduce()
    print(f" * Acc@1 {top1.avg:.3f}")
    return top1.avg


def main_worker(args):
    dist.init_process_group(backend="gloo")
    model = DistributedDataParallel(torch.nn.Linear(8, 4))
    val_dataset = TensorDataset(torch.randn(64, 8), torch.randint(0, 4, (64,)))
    val_sampler = DistributedSampler(val_dataset, shuffle=False, drop_last=True)
    val_loader = DataLoader(val_dataset, batch_size=16, shuffle=False, sampler=val_sampler)
    acc1 = validate(val_loader, model, torch.nn.CrossEntropyLoss(), args)
    if dist.get_rank() == 0:
        print("best", acc1)


if __name__ == "__main__":
    main_worker(None)
