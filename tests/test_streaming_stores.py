"""Copies and layer-norm outputs larger than the last-level cache are written with
streaming (non-temporal) stores (host/tile.c tpu__stream_copy). TORCHTPU_STREAM_MIN_BYTES=1
sends every such output down that path; =0 turns it off. The two runs must agree bit for
bit and match CPU, including unaligned starts and tails that are not a multiple of the
store width. Memory-bound elementwise kernels (add, mul, neg, where, ... : TILE_FS in
host/elementwise.c) stream their float32 outputs through the tile engine; exp, gelu and
softmax keep ordinary stores and are checked too."""
import os
import subprocess
import sys

import torch

SCRIPT = r"""
import sys, torch, torch.nn.functional as F
torch.manual_seed(0)
x, y = torch.randn(70001), torch.randn(70001)
rows = torch.randn(37, 1029)
w, b = torch.randn(1029), torch.randn(1029)
out = {}
for dev in ("cpu", "tpu"):
    xd, yd, rd = x.to(dev), y.to(dev), rows.to(dev)
    r = {}
    r["add"] = xd + yd
    r["add_unaligned"] = xd[3:] + yd[1:-2]   # output aligned, inputs not
    r["mul_scalar"] = xd[5:] * 1.5
    r["exp"] = torch.exp(xd)
    r["gelu"] = F.gelu(xd[1:])
    r["broadcast"] = rd * w.to(dev)
    r["clone"] = xd.clone()
    r["clone_odd"] = xd[7:70000].clone()
    dst = torch.empty(70001 - 9, device=dev)
    r["copy_"] = dst.copy_(xd[9:])
    r["transpose"] = rd.t().contiguous()
    r["cat"] = torch.cat([xd, yd[:-1]])
    r["softmax"] = torch.softmax(rd, 1)
    r["log_softmax"] = torch.log_softmax(rd[:, 1:], 1)
    r["layer_norm"] = F.layer_norm(rd, (1029,), w.to(dev), b.to(dev))
    r["layer_norm_plain"] = F.layer_norm(rd[:, :1000].contiguous(), (1000,))
    r["neg_strided_in"] = torch.neg(xd[::2])  # dense output, strided input
    r["where"] = torch.where(xd > 0, xd, yd)
    r["relu_int_scalar"] = torch.relu(xd[2:]) + 2   # output starts 8 bytes into its block
    odd = torch.empty(70001 + 1, device=dev)[1:]     # output 4 bytes past alignment
    r["mul_out_unaligned"] = torch.mul(xd, yd, out=odd)
    inplace = xd.clone()
    inplace.add_(yd)                           # in place: the output is also an input
    r["add_"] = inplace
    out[dev] = {k: v.cpu() for k, v in r.items()}
torch.save(out, sys.argv[1])
"""


def run(tmp_path, min_bytes):
    path = tmp_path / f"s{min_bytes}.pt"
    env = dict(os.environ, TORCHTPU_STREAM_MIN_BYTES=str(min_bytes), TORCHTPU_EAGER_MODE="strict")
    subprocess.run([sys.executable, "-c", SCRIPT, str(path)], env=env, check=True, timeout=300)
    return torch.load(path)


def test_streamed_outputs_match_cached_stores_and_cpu(tmp_path):
    on, off = run(tmp_path, 1), run(tmp_path, 0)
    for key, v in on["tpu"].items():
        assert torch.equal(v, off["tpu"][key]), f"{key}: streaming stores changed the result"
        torch.testing.assert_close(v, on["cpu"][key], rtol=1e-5, atol=1e-5, msg=f"{key}: differs from CPU")
