# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""PyTorch's ImageNet example idiom: on a machine without an accelerator the model is left
as it is, although the process group is set up and the run is distributed."""
import torch
import torch.distributed as dist


def main_worker(gpu, args):
    dist.init_process_group("gloo", rank=args.rank, world_size=args.world_size)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    if not torch.cuda.is_available():
        print("using CPU, this will be slow")
    elif args.distributed:
        torch.cuda.set_device(gpu)
        model.cuda(gpu)
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[gpu])
    return model


if __name__ == "__main__":
    main_worker(0, None)
