# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""MAE's main_finetune.py idiom: with --dist_eval the validation set goes through a
DistributedSampler, which pads the shards with repeated images (the script only warns)."""
import torch
import torch.distributed as dist


def main(args, dataset_train, dataset_val):
    dist.init_process_group("gloo")
    num_tasks, global_rank = dist.get_world_size(), dist.get_rank()
    sampler_train = torch.utils.data.DistributedSampler(
        dataset_train, num_replicas=num_tasks, rank=global_rank, shuffle=True)
    if args.dist_eval:
        if len(dataset_val) % num_tasks != 0:
            print("Warning: Enabling distributed evaluation with an eval dataset not divisible")
        sampler_val = torch.utils.data.DistributedSampler(
            dataset_val, num_replicas=num_tasks, rank=global_rank, shuffle=False)
    else:
        sampler_val = torch.utils.data.SequentialSampler(dataset_val)
    return sampler_train, sampler_val
