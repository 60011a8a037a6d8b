"""tpu_dist: torch.distributed collectives, DistributedDataParallel and FSDP2 on tpu tensors,
two real processes per test (tests/dist_worker.py), in the eager mode the suite runs in
(the CI runs it in each)."""
import json
import os
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import torchtpu
from tolerances import assert_close

WORKER = os.path.join(os.path.dirname(__file__), "dist_worker.py")
pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def run_ranks(mode, backend, world=2):
    """world processes on this host, with the environment torchrun gives them."""
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHTPU_NUM_DEVICES", "TPU_VISIBLE_DEVICES", "TORCHTPU_NUM_THREADS")}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout's torchtpu
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port(), WORLD_SIZE=str(world),
               LOCAL_WORLD_SIZE=str(world), PYTHONPATH=os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")])))
    procs = [subprocess.Popen([sys.executable, WORKER, mode, backend], env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        assert line, out + err[-2000:]
        results.append(json.loads(line[0][len("RESULT "):]))
    return results


def cpu_reference():
    """One process, the whole batch, the same model and optimizer on CPU."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                                torch.nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    X, Y = torch.randn(16, 8, generator=g), torch.randn(16, 2, generator=g)
    for _ in range(5):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(X), Y).backward()
        opt.step()
    return [p.detach().flatten() for p in model.parameters()]


@pytest.mark.parametrize("backend", ["none", "tpu_dist"])  # init_process_group() / ("tpu_dist")
def test_collectives_and_ddp_two_processes(backend):
    mode = torchtpu.get_eager_mode()
    r0, r1 = run_ranks(mode, backend)
    for r in (r0, r1):
        assert r["is_tpu_dist"]
        assert r["device_count"] == 2  # LOCAL_WORLD_SIZE: set_device(local_rank) works
        assert r["pool_threads"] == max(1, (os.cpu_count() or 1) // 2)  # each its share of the cores
        assert r["all_reduce"] == [6.0] * 4  # (1 + 2) * 2
        assert r["avg"] == [1.5] * 3
        assert r["max"] == [2.0] * 2
        assert r["broadcast"] == [0.0, 2.0, 4.0]
        assert r["all_gather"] == [[0.0, 0.0], [1.0, 1.0]]
        assert r["all_gather_into_tensor"] == [0.0, 0.0, 1.0, 1.0]
        assert r["subgroup"] == [3.0, 3.0] and r["cpu_tensor"] == [3.0, 3.0]
        assert r["strided"] == [[0.0, 6.0], [2.0, 8.0], [4.0, 10.0]]
        assert "ReduceOp.AVG needs floating tensors" in r["avg_int_error"]
    # reduce_scatter of (arange(4) + rank) summed over ranks = [1, 3, 5, 7]; rank r gets block r
    assert r0["reduce_scatter_tensor"] == [1.0, 3.0] and r1["reduce_scatter_tensor"] == [5.0, 7.0]
    assert r0["all_to_all_single"] == [0.0, 1.0, 10.0, 11.0]
    assert r1["all_to_all_single"] == [2.0, 3.0, 12.0, 13.0]
    assert r1["recv"] == [7.0, 8.0]
    if mode == "defer_and_fuse":  # the pending graph was cut by the collective, by name
        assert "collective all_reduce" in r0["explain_reasons"]
    # DDP: both ranks hold the same parameters, equal to one process on the whole batch
    ref = cpu_reference()
    for a, b, want in zip(r0["ddp_params"], r1["ddp_params"], ref):
        assert a == b
        assert_close(torch.tensor(a), want)
    # FSDP2 (fully_shard): the same, with everything sharded over the two ranks
    for a, b, want in zip(r0["fsdp_params"], r1["fsdp_params"], ref):
        assert a == b
        assert_close(torch.tensor(a), want)


def test_default_backend_of_tpu_is_tpu_dist():
    assert dist.Backend.default_device_backend_map["tpu"] == "tpu_dist"
    assert "tpu" in dist.Backend.backend_capability["tpu_dist"]
