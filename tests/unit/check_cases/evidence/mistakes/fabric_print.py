# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""lit-llama's finetune/adapter.py idiom: `fabric.print` for most messages, a plain `print`
for a few; Fabric runs the function in every process."""
import lightning as L
import torch


def main(out_dir="out"):
    fabric = L.Fabric(accelerator="cpu", devices=2)
    fabric.launch()
    fabric.seed_everything(1337 + fabric.global_rank)
    model = torch.nn.Linear(4, 4)
    num_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(f"Number of trainable parameters: {num_params}")
    model, optimizer = fabric.setup(model, torch.optim.AdamW(model.parameters()))
    for step in range(10):
        fabric.print(f"iter {step}")
        if step % 5 == 0:
            print(f"Saving adapter weights to {out_dir}")


if __name__ == "__main__":
    main()
