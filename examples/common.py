"""Shared bits of the examples: device choice, a deterministic training loop."""
import time

import torch


def pick_device(name=None):
    if name:
        return torch.device(name)
    import torchtpu  # noqa: F401  (also autoloaded by `import torch`)
    return torch.accelerator.current_accelerator()


def train(model, batches, loss_fn, optimizer_fn, device, steps, clip=1.0, log_every=0, items_per_step=0):
    """Trains `model` (already initialized; moved to device here) and returns the losses."""
    model = model.to(device)
    opt = optimizer_fn(model.parameters())
    losses = []
    t0 = time.perf_counter()
    for step in range(steps):
        x, y = batches(step)
        x, y = x.to(device), y.to(device)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(loss.item())
        if log_every and (step % log_every == 0 or step == steps - 1):
            dt = time.perf_counter() - t0
            rate = f", {items_per_step * (step + 1) / dt:,.0f} tokens/s" if items_per_step else ""
            print(f"step {step:4d}  loss {losses[-1]:.4f}{rate}", flush=True)
    return losses
