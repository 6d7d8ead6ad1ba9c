# ruff: noqa
# Verbatim from the lesson; its mistakes are deliberately left as written.
import torch
import torch.nn as nn
import torch.optim as optim

# 1. 设置设备：优先使用GPU，如果没有则使用CPU
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
print(f"使用设备: {device}")

# 2. 定义一个简单的模型
class SimpleNet(nn.Module):
    def __init__(self):
        super(SimpleNet, self).__init__()
        self.fc = nn.Linear(10, 2)

    def forward(self, x):
        return self.fc(x)

# 3. 实例化模型，并将其迁移到GPU
model = SimpleNet().to(device)
print(f"模型已加载到 {device}")

# 4. 创建模拟数据和标签，并迁移到GPU
input_data = torch.randn(5, 10).to(device)  # 形状为(5, 10)的随机数据
labels = torch.randint(0, 2, (5,)).to(device) # 形状为(5,)的随机标签

# 5. 定义损失函数和优化器
criterion = nn.CrossEntropyLoss()
optimizer = optim.SGD(model.parameters(), lr=0.01)

# 6. 进行一步训练
optimizer.zero_grad()          # 清空梯度
outputs = model(input_data)    # 前向传播（在GPU上）
loss = criterion(outputs, labels) # 计算损失
loss.backward()                # 反向传播
optimizer.step()               # 更新参数

print(f"训练完成，损失: {loss.item()}")
