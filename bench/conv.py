"""Convolution and pooling kernels, tpu (strict) vs PyTorch's CPU eager, side by side in
one process: forward and `convolution_backward` (grad_input and grad_weight) of
ResNet-50's convolution shapes at batch 8, of bench/models.py's ResNet-18 (its stem and
stride-2 convolutions) and of examples/train_cnn.py's two convolutions, and AvgPool2d(2) forward and backward. Prints milliseconds per call (best
of --reps x --calls) for each device and the ratio; devices alternate within each case.

    python bench/conv.py [--only resnet|resnet18|cnn|pool] [--reps 5] [--calls 5]
"""
import argparse

import torch
import torch.nn.functional as F

import torchtpu
from _timing import best_per_call

A = torch.ops.aten

# (input shape, weight shape, stride, padding)
RESNET = [((8, 3, 224, 224), (64, 3, 7, 7), 2, 3), ((8, 64, 56, 56), (64, 64, 3, 3), 1, 1),
          ((8, 64, 56, 56), (256, 64, 1, 1), 1, 0), ((8, 256, 56, 56), (64, 256, 1, 1), 1, 0),
          ((8, 128, 28, 28), (128, 128, 3, 3), 1, 1), ((8, 256, 14, 14), (256, 256, 3, 3), 1, 1),
          ((8, 512, 7, 7), (512, 512, 3, 3), 1, 1)]
# bench/models.py's ResNet-18 (batch 16, 128x128): its stem and stride-2 convolutions
RESNET18 = [((16, 3, 128, 128), (64, 3, 7, 7), 2, 3), ((16, 64, 32, 32), (128, 64, 3, 3), 2, 1),
            ((16, 128, 16, 16), (256, 128, 3, 3), 2, 1), ((16, 256, 8, 8), (512, 256, 3, 3), 2, 1)]
CNN = [((64, 3, 16, 16), (16, 3, 3, 3), 1, 1), ((64, 16, 8, 8), (32, 16, 3, 3), 1, 1)]
POOL = [(64, 32, 8, 8), (32, 64, 56, 56)]


def conv_case(xs, ws, s, p):
    torch.manual_seed(0)
    x, w = torch.randn(xs), torch.randn(ws) * ws[1] ** -0.5
    g = torch.randn(F.conv2d(x, w, None, s, p).shape)

    def make(dev):
        X, W, G = x.to(dev), w.to(dev), g.to(dev)
        return {"forward": lambda: F.conv2d(X, W, None, s, p),
                "backward": lambda: A.convolution_backward(G, X, W, None, [s, s], [p, p], [1, 1], False, [0, 0], 1,
                                                           [True, True, False])}
    return f"conv {xs} w{ws} stride {s}", make


def pool_case(xs):
    torch.manual_seed(0)
    x = torch.randn(xs)
    g = torch.randn(F.avg_pool2d(x, 2).shape)

    def make(dev):
        X, G = x.to(dev), g.to(dev)
        return {"forward": lambda: F.avg_pool2d(X, 2),
                "backward": lambda: A.avg_pool2d_backward(G, X, [2, 2], [2, 2], [0, 0], False, True, None)}
    return f"avg_pool2d(2) {xs}", make


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["resnet", "resnet18", "cnn", "pool"])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--calls", type=int, default=5)
    a = ap.parse_args()
    torchtpu.set_eager_mode("strict")
    cases = ([conv_case(*c) for c in RESNET] if a.only in (None, "resnet") else []) + \
            ([conv_case(*c) for c in RESNET18] if a.only in (None, "resnet18") else []) + \
            ([conv_case(*c) for c in CNN] if a.only in (None, "cnn") else []) + \
            ([pool_case(c) for c in POOL] if a.only in (None, "pool") else [])
    print("| case | pass | tpu ms | cpu ms | tpu / cpu (speed) |\n|---|---|---:|---:|---:|")
    for name, make in cases:
        fns = {dev: make(dev) for dev in ("tpu", "cpu")}
        for part in ("forward", "backward"):
            t = {dev: best_per_call(fns[dev][part], dev, a.reps, a.calls) * 1e3 for dev in ("tpu", "cpu")}
            print(f"| {name} | {part} | {t['tpu']:.3f} | {t['cpu']:.3f} | {t['cpu'] / t['tpu']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
