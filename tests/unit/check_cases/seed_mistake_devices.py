# ruff: noqa
# Verbatim from the lesson; its mistakes are deliberately left as written.
# 错误示例
model = SimpleNet()  # 在CPU上
input_gpu = torch.randn(2, 10).cuda()  # 数据在GPU上
output = model(input_gpu)  # 报错！模型参数在CPU，输入在GPU
