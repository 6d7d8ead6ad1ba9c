# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""lit-llama's pretrain/redpajama.py idiom: validate() averages the loss over this rank's
shard of the validation loader and the caller prints and logs it with no reduction."""
import lightning as L
import torch


@torch.no_grad()
def validate(fabric, model, val_dataloader, eval_iters=10):
    model.eval()
    losses = torch.zeros(eval_iters)
    for k, val_data in enumerate(val_dataloader):
        if k >= eval_iters:
            break
        losses[k] = model(val_data).mean().item()
    out = losses.mean()
    model.train()
    return out


def main(train_dataloader, val_dataloader):
    fabric = L.Fabric(devices=2)
    fabric.launch()
    model = fabric.setup(torch.nn.Linear(4, 4))
    train_dataloader, val_dataloader = fabric.setup_dataloaders(train_dataloader,
                                                                val_dataloader)
    with fabric.no_backward_sync(model, enabled=False):
        pass
    val_loss = validate(fabric, model, val_dataloader)
    fabric.print(f"val loss {val_loss:.4f}")
