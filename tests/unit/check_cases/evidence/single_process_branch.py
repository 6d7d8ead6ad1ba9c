# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""The `else:` of `if args.distributed:` and YOLO's `--evolve` branch (asserted to run as one
process): code that only ever runs at world size 1."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main(args):
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 2)
    if args.distributed:
        model = DDP(model)
    else:
        print("single process: not wrapping the model")
        torch.save(model.state_dict(), "init.pt")
    if args.evolve:
        assert args.local_rank == -1, "DDP mode not implemented for --evolve"
        print(f"Hyperparameter evolution complete. Best results saved as: {args.yaml_file}")


if __name__ == "__main__":
    main(None)
