"""A small CNN (conv2d, batchnorm, max/avg pooling) trained with AdamW on synthetic images:
the label is which quadrant holds the bright blob."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import pick_device, train


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AvgPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 4))


def batches(step, n=32):
    g = torch.Generator().manual_seed(2000 + step)
    label = torch.randint(0, 4, (n,), generator=g)
    x = 0.3 * torch.randn(n, 3, 16, 16, generator=g)
    for i in range(n):
        r, c = divmod(int(label[i]), 2)
        x[i, :, r * 8 + 2:r * 8 + 6, c * 8 + 2:c * 8 + 6] += 1.5
    return x, label


def run(device, steps=20, foreach=None, log_every=0):
    return train(make_model(), batches, F.cross_entropy,
                 lambda p: torch.optim.AdamW(p, lr=3e-3, weight_decay=0.01, foreach=foreach),
                 device, steps, log_every=log_every)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default=None)
    ap.add_argument("--steps", type=int, default=100)
    a = ap.parse_args()
    run(pick_device(a.device), a.steps, log_every=10)
