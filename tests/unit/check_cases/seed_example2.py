# ruff: noqa
# Verbatim from the lesson; its mistakes are deliberately left as written.
import torch
import torch.nn as nn
import torch.optim as optim
from torch.nn import DataParallel

# 检查可用GPU数量
num_gpus = torch.cuda.device_count()
print(f"检测到 {num_gpus} 个GPU")

# 定义模型
model = SimpleNet() # 使用示例1中的SimpleNet

# 如果有多于一个GPU，使用DataParallel包装模型
if num_gpus > 1:
    print(f"使用 DataParallel 进行多GPU训练")
    model = DataParallel(model)

# 将模型移动到主GPU（通常是‘cuda:0’）
device = torch.device("cuda:0")
model = model.to(device)

# 训练过程与单GPU几乎完全相同，PyTorch会自动处理数据分配和梯度同步
input_data = torch.randn(16, 10).to(device) # 注意：批次大小可以更大
labels = torch.randint(0, 2, (16,)).to(device)

optimizer = optim.SGD(model.parameters(), lr=0.01)
criterion = nn.CrossEntropyLoss()

optimizer.zero_grad()
outputs = model(input_data)    # DataParallel 会自动拆分输入
loss = criterion(outputs, labels)
loss.backward()                # 梯度会自动同步
optimizer.step()

print("多GPU训练一步完成。")
