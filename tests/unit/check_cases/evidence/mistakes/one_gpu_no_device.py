# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""PyTorch's ImageNet example idiom: launched without --gpu (torchrun), the model is moved
with `.cuda()` and wrapped without `device_ids`, and no process picks its GPU."""
import torch
import torch.distributed as dist


def main_worker(gpu, args):
    dist.init_process_group("nccl")
    model = torch.nn.Linear(8, 8)
    if args.gpu is not None:
        torch.cuda.set_device(args.gpu)
        model.cuda(args.gpu)
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
    else:
        model.cuda()
        model = torch.nn.parallel.DistributedDataParallel(model)
    return model
