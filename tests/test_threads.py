"""The host driver's thread pool: results must not depend on the thread count.

Each case runs in a fresh process (the pool is sized once, from TORCHTPU_NUM_THREADS) with
1, 2 and 3 threads; tensors are large enough that every parallelized kernel family takes
its threaded path, and the outputs must be bitwise identical."""
import os
import subprocess
import sys

import torch

SCRIPT = r"""
import sys, torch, torch.nn.functional as F
torch.manual_seed(0)
dev = "tpu"
x = torch.randn(300, 1000)
w = torch.randn(1000)
b = torch.randn(1000)
big = torch.randn(3_000_000)
idx = torch.randint(0, 300, (4000,))
img = torch.randn(4, 8, 40, 40)
cw = torch.randn(16, 8, 3, 3)
q, k, v = (torch.randn(2, 4, 256, 32) for _ in range(3))
out = {}
xd = x.to(dev).requires_grad_()
out["add"] = xd + xd * 3.0
out["gelu_bf16"] = F.gelu(xd.to(torch.bfloat16))
xk = torch.randn(300, 1100).to(dev).to(torch.bfloat16)
out["mm_bf16"] = xk @ xk.t()  # 300 x 1100 x 300: the bf16 GEMM's threaded path, two K blocks
qb, kb = (t.flatten(0, 1).to(torch.bfloat16).to(dev) for t in (q, k))
out["bmm_bf16"] = torch.bmm(qb, kb.transpose(1, 2))  # 8 small products: batches on the pool
out["tiny_rows"] = torch.randn(40000, 3).to(dev) * torch.randn(3).to(dev)
out["sum_rows"] = xd.sum(1)
out["sum_cols"] = xd.sum(0)
out["sum_all"] = big.to(dev).sum()
out["norm_all"] = big.to(dev).norm()
out["var"] = xd.var(1)
out["softmax"] = torch.softmax(xd, 1)
out["log_softmax_dim0"] = torch.log_softmax(xd, 0)
ln = F.layer_norm(xd, (1000,), w.to(dev).requires_grad_(), b.to(dev))
out["layer_norm"] = ln
out["cumsum"] = xd.cumsum(1)
out["emb"] = F.embedding(idx.to(dev), xd)
out["index_select"] = xd.index_select(0, idx.to(dev))
out["conv"] = F.conv2d(img.to(dev), cw.to(dev), padding=1)
# blocks of images over the pool; the weight gradient summed per part
imgs, cwd = torch.randn(40, 8, 12, 12).to(dev).requires_grad_(), cw.to(dev).requires_grad_()
out["conv_blocks"] = F.conv2d(imgs, cwd, stride=1, padding=1)
out["conv_blocks"].square().sum().backward()
out["conv_gx"], out["conv_gw"] = imgs.grad, cwd.grad
bx = torch.randn(32, 16, 20, 20).to(dev).requires_grad_()
out["batch_norm"] = F.batch_norm(bx, None, None, training=True)
out["batch_norm"].square().sum().backward()
out["batch_norm_gx"] = bx.grad
a_rows, a_cols = torch.randn(500, 700), torch.randn(40, 700)
bm = torch.randn(700, 900)
out["mm_row_blocks"] = a_rows.to(dev) @ bm.to(dev)
out["mm_col_blocks"] = a_cols.to(dev) @ bm.to(dev)
out["addmm_t"] = torch.addmm(b[:900].to(dev), a_rows.to(dev), bm.to(dev).t().contiguous().t())
out["bmm_batches"] = torch.bmm(torch.randn(6, 200, 300).to(dev), torch.randn(6, 300, 100).to(dev))
# 3 large products (67 MFLOP each): one after another, each split into row blocks
out["bmm_blocks"] = torch.bmm(torch.randn(3, 256, 512).to(dev), torch.randn(3, 256, 512).to(dev).transpose(1, 2))
qd, kd, vd = (t.to(dev).requires_grad_() for t in (q, k, v))
out["sdpa"] = F.scaled_dot_product_attention(qd, kd, vd, is_causal=True)
out["sdpa"].square().sum().backward()
out["sdpa_dq"], out["sdpa_dk"], out["sdpa_dv"] = qd.grad, kd.grad, vd.grad
# one head of 300 rows: the forward's row ranges follow the thread count, the backward's
# kernel choice must not
q1, k1, v1 = (torch.randn(1, 1, 300, 40).to(dev).requires_grad_() for _ in range(3))
out["sdpa_1head"] = F.scaled_dot_product_attention(q1, k1, v1)
out["sdpa_1head"].square().sum().backward()
out["sdpa_1head_dq"], out["sdpa_1head_dk"] = q1.grad, k1.grad
# LAPACK decompositions: batches of matrices over the pool, one LAPACK chain per matrix
sq = torch.randn(24, 40, 40)
spd = (sq @ sq.mT + 40 * torch.eye(40)).to(dev)
sqd, rhs = sq.to(dev), torch.randn(24, 40, 3).to(dev)
out["cholesky"] = torch.linalg.cholesky(spd)
out["lu_factor"], out["lu_pivots"] = torch.linalg.lu_factor(sqd)
out["solve"] = torch.linalg.solve(sqd, rhs)
out["lu_solve"] = torch.linalg.lu_solve(out["lu_factor"], out["lu_pivots"], rhs)
out["inv"] = torch.linalg.inv(sqd)
out["slogdet"] = torch.linalg.slogdet(sqd).logabsdet
out["qr"] = torch.linalg.qr(sqd)[1]
out["eigh"] = torch.linalg.eigh(spd)[1]
out["svd"] = torch.linalg.svd(sqd)[0]
(ln.square().sum() + torch.log_softmax(xd, 1).sum()).backward()
out["grad_x"] = xd.grad
torch.save({k: v.detach().cpu() for k, v in out.items()}, sys.argv[1])
"""


def test_results_do_not_depend_on_thread_count(tmp_path):
    results = []
    for n in (1, 2, 3):
        path = tmp_path / f"t{n}.pt"
        env = dict(os.environ, TORCHTPU_NUM_THREADS=str(n))
        subprocess.run([sys.executable, "-c", SCRIPT, str(path)], env=env, check=True, timeout=300)
        results.append(torch.load(path))
    base = results[0]
    for n, r in zip((2, 3), results[1:]):
        for key in base:
            assert torch.equal(base[key], r[key]), f"{key}: differs between 1 and {n} threads"
