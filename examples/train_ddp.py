"""Data-parallel GPT training on tpu with DistributedDataParallel, written as CUDA code
is, with "cuda" -> "tpu" and no backend name (tpu_dist is tpu's default):

    torchrun --nproc_per_node=2 examples/train_ddp.py --steps 50

Each process trains on its own batches; DDP averages the gradients over processes
(tpu_dist: PyTorch's Gloo between processes, so also across hosts with torchrun's
--nnodes/--rdzv-endpoint). Rank 0 prints the loss."""
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import train_gpt


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    a = ap.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.tpu.set_device(local_rank)  # was: torch.cuda.set_device(local_rank)
    dist.init_process_group()  # was: dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("tpu", local_rank)
    model = DDP(train_gpt.make_model(d=a.d, layers=a.layers).to(device), device_ids=[local_rank])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    batches = train_gpt.make_batches()
    for step in range(a.steps):
        x, y = batches(step * world + rank)  # each rank its own data
        loss = train_gpt.loss_fn(model(x.to(device)), y.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if rank == 0 and (step % 10 == 0 or step == a.steps - 1):
            print(f"step {step:4d}  loss {loss.item():.4f}  ({world} processes)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
