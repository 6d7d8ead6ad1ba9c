# ruff: noqa
# Verbatim from the lesson; its mistakes are deliberately left as written.
# 注意：此示例需要使用 `torch.distributed.launch` 或 `torchrun` 命令启动
# 例如：torchrun --nproc_per_node=2 你的脚本名.py

import os
import torch
import torch.nn as nn
import torch.optim as optim
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

def train(rank, world_size):
    # 1. 初始化进程组（所有进程需要共同完成）
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    device_id = rank % torch.cuda.device_count()
    torch.cuda.set_device(device_id)

    # 2. 创建模型并移至当前GPU
    model = SimpleNet().to(device_id)

    # 3. 用DDP包装模型，这是关键！
    ddp_model = DDP(model, device_ids=[device_id])

    # 4. 创建优化器和数据
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.01)
    criterion = nn.CrossEntropyLoss()
    # 注意：在分布式训练中，每个进程应加载不同的数据子集（由DistributedSampler处理）
    # 这里为简化，使用相同数据，但实际项目中请使用Sampler。

    # 5. 训练循环
    for epoch in range(2):
        optimizer.zero_grad()
        input_data = torch.randn(4, 10).to(device_id)
        labels = torch.randint(0, 2, (4,)).to(device_id)

        outputs = ddp_model(input_data)
        loss = criterion(outputs, labels)
        loss.backward()  # 梯度会在所有进程间自动同步
        optimizer.step()

        print(f"进程 {rank}, 周期 {epoch}, 损失: {loss.item()}")

    # 6. 清理
    dist.destroy_process_group()

if __name__ == "__main__":
    # 世界大小（总进程数，这里假设为2）
    world_size = 2
    # 此示例需要由外部启动器（如torchrun）启动，这里仅为说明结构
    # 实际运行时，每个进程会独立执行此脚本，rank由启动器分配
    print("请使用 `torchrun --nproc_per_node=2 此脚本名.py` 来启动分布式训练。")
