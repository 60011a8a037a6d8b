"""A small MLP classifier trained with SGD (momentum) on a synthetic two-moons-like set."""
import argparse
import math

import torch
import torch.nn.functional as F

from common import pick_device, train


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(2, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.GELU(),
        torch.nn.Linear(64, 2))


def batches(step, n=128):
    g = torch.Generator().manual_seed(1000 + step)
    t = torch.rand(n, generator=g) * math.pi
    label = torch.randint(0, 2, (n,), generator=g)
    x = torch.stack([torch.cos(t) + label, torch.sin(t) * (1 - 2 * label) + 0.5 * label], 1)
    return x + 0.1 * torch.randn(n, 2, generator=g), label


def run(device, steps=20, foreach=None, log_every=0):
    return train(make_model(), batches, F.cross_entropy,
                 lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=foreach),
                 device, steps, log_every=log_every)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default=None)
    ap.add_argument("--steps", type=int, default=100)
    a = ap.parse_args()
    run(pick_device(a.device), a.steps, log_every=10)
