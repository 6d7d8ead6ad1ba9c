# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""DeiT's main.py idiom: seeds differ per rank (`seed = args.seed + utils.get_rank()`), the
EMA copies the model, and only then does DDP broadcast rank 0's weights."""
import torch
import torch.distributed as dist
from timm.utils import ModelEma
from torch.nn.parallel import DistributedDataParallel as DDP


def main(args):
    dist.init_process_group("gloo")
    seed = args.seed + dist.get_rank()
    torch.manual_seed(seed)
    model = torch.nn.Linear(16, 10)
    model_ema = ModelEma(model, decay=args.model_ema_decay, device="", resume="")
    model = DDP(model)
    return model, model_ema


if __name__ == "__main__":
    main(None)
