"""One epoch, accumulating through a loss-scaler helper."""


def one_epoch(model, loader, optimizer, scaler_step, epoch, accum):
    loader.sampler.set_epoch(epoch)
    for i, (x, y) in enumerate(loader):
        loss = model(x, y) / accum
        scaler_step(loss, optimizer, update_grad=(i + 1) % accum == 0)
    print("epoch", epoch, "done")
