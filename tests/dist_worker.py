"""One rank of tests/test_distributed.py, started the way torchrun starts one (RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment)
and written the way CUDA code is, with "cuda" -> "tpu": python dist_worker.py MODE BACKEND.
Prints one JSON line with what the test checks."""
import json
import os
import sys

import torch
import torch.distributed as dist

import torchtpu

mode, backend = sys.argv[1], sys.argv[2]
rank, world, local_rank = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
torchtpu.set_eager_mode(mode)
torch.tpu.set_device(local_rank)
dist.init_process_group(None if backend == "none" else backend)
out = {"rank": rank, "is_tpu_dist": dist.get_backend() in ("tpu_dist", "undefined"),
       "device_count": torch.tpu.device_count(),
       "pool_threads": int(os.environ["TORCHTPU_NUM_THREADS"])}
dev = torch.device("tpu", local_rank)


def full(n, v):
    return torch.full((n,), float(v), device=dev)


torchtpu.explain(clear=True)
t = full(4, rank + 1) * 2  # pending in defer_and_fuse until the collective cuts it
dist.all_reduce(t)
out["all_reduce"] = t.tolist()
out["explain_reasons"] = [c["reason"] for c in torchtpu.explain()]
t = full(3, rank + 1)
dist.all_reduce(t, op=dist.ReduceOp.AVG)
out["avg"] = t.tolist()
t = full(2, rank + 1)
dist.all_reduce(t, op=dist.ReduceOp.MAX)
out["max"] = t.tolist()
b = torch.arange(3.0, device=dev) * (rank + 1)
dist.broadcast(b, src=world - 1)
out["broadcast"] = b.tolist()
outs = [torch.empty(2, device=dev) for _ in range(world)]
dist.all_gather(outs, full(2, rank))
out["all_gather"] = [o.tolist() for o in outs]
big = torch.empty(world * 2, device=dev)
dist.all_gather_into_tensor(big, full(2, rank))
out["all_gather_into_tensor"] = big.tolist()
rs = torch.empty(2, device=dev)
dist.reduce_scatter_tensor(rs, torch.arange(world * 2.0, device=dev) + rank)
out["reduce_scatter_tensor"] = rs.tolist()
a2a = torch.empty(world * 2, device=dev)
dist.all_to_all_single(a2a, torch.arange(world * 2.0, device=dev) + 10 * rank)
out["all_to_all_single"] = a2a.tolist()
sub = dist.new_group(list(range(world)))  # a second group, made through the same backend
t = full(2, rank + 1)
dist.all_reduce(t, group=sub)
out["subgroup"] = t.tolist()
c = torch.full((2,), float(rank + 1))  # a CPU tensor in the tpu_dist group
dist.all_reduce(c)
out["cpu_tensor"] = c.tolist()
strided = torch.arange(6.0, device=dev).view(2, 3).t()  # a non-contiguous tensor
dist.all_reduce(strided)
out["strided"] = strided.tolist()
if rank == 0:
    dist.send(torch.tensor([7.0, 8.0], device=dev), 1)
elif rank == 1:
    r = torch.empty(2, device=dev)
    dist.recv(r, 0)
    out["recv"] = r.tolist()
try:
    dist.all_reduce(torch.ones(2, dtype=torch.int64, device=dev), op=dist.ReduceOp.AVG)
except ValueError as e:
    out["avg_int_error"] = str(e)
dist.barrier()

# DDP: each rank trains on its half of the batch; the result must match one process
# training on the whole batch (gradients averaged over ranks = the full batch's mean).
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                            torch.nn.Linear(16, 2))
ddp = torch.nn.parallel.DistributedDataParallel(model.to(dev), device_ids=[local_rank])
opt = torch.optim.AdamW(ddp.parameters(), lr=0.05)
g = torch.Generator().manual_seed(1)
X, Y = torch.randn(16, 8, generator=g), torch.randn(16, 2, generator=g)
losses = []
for _ in range(5):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(ddp(X[rank::world].to(dev)), Y[rank::world].to(dev))
    loss.backward()
    opt.step()
    losses.append(loss.item())
out["ddp_params"] = [p.detach().cpu().flatten().tolist() for p in model.parameters()]
out["ddp_losses"] = losses

# FSDP2: the same training with parameters, gradients and optimizer state sharded over
# the ranks (all-gather before use, reduce-scatter of gradients).
from torch.distributed.fsdp import fully_shard  # noqa: E402

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                            torch.nn.Linear(16, 2)).to(dev)
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=0.05)
for _ in range(5):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(X[rank::world].to(dev)), Y[rank::world].to(dev)).backward()
    opt.step()
out["fsdp_params"] = [p.full_tensor().detach().cpu().flatten().tolist() for p in model.parameters()]
dist.destroy_process_group()
print("RESULT " + json.dumps(out), flush=True)
