"""tpu_dist: the torch.distributed backend of the tpu device.

`dist.init_process_group("tpu_dist")`, or `dist.init_process_group()` with no backend
when tpu is the accelerator, gives a process group whose collectives take tpu tensors,
so DistributedDataParallel and the `dist.*` collectives run unchanged ("nccl" ->
"tpu_dist"). With the host driver every device is this machine's memory, and the
transport between processes (and hosts) is PyTorch's own Gloo: each collective stages
its tpu tensors to host buffers, runs Gloo's collective on them and writes the result
back. A collective is a cut point of defer_and_fuse: the pending graph is cut (and
explain() names the collective) before its inputs are read.

Collectives run to completion before they return; the returned work objects are
complete, so `async_op=True` and DDP's overlap of communication with backward are
accepted but do not overlap.
"""
from __future__ import annotations

import datetime

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from . import modes

BACKEND = "tpu_dist"
_SUM = dist.ReduceOp.SUM


def _done(result) -> dist.Work:
    fut = torch.futures.Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


def _stage(tensors, what: str) -> list[torch.Tensor]:
    """Host copies of the tpu tensors among tensors (others pass as they are); cuts the
    pending graph first, naming the collective."""
    cut = set()
    for t in tensors:
        if t.device.type == "tpu" and t.device.index not in cut:
            modes.flush(t.device.index, f"collective {what}")
            cut.add(t.device.index)
    return [t.cpu() if t.device.type == "tpu" else t for t in tensors]


def _buffers(tensors) -> list[torch.Tensor]:
    """Host buffers for the tpu tensors among tensors that a collective only writes."""
    return [torch.empty(t.shape, dtype=t.dtype) if t.device.type == "tpu" else t for t in tensors]


def _rank_blocks(out: torch.Tensor, ranks: int, shape) -> list[torch.Tensor]:
    """The ranks consecutive blocks of a contiguous out, each viewed as shape."""
    n = torch.Size(shape).numel()
    if n == 0:
        return [out.new_empty(shape) for _ in range(ranks)]
    return [b.view(shape) for b in out.view(-1).split(n)]


def _unstage(dst, staged) -> None:
    for d, s in zip(dst, staged):
        if d is not s:
            d.copy_(s)


class TpuDistProcessGroup(dist.ProcessGroup):
    """A process group over Gloo for tpu (and CPU) tensors; see the module docstring."""

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta):
        super().__init__(rank, size)
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        # CPU tensors' backend; it also holds the group's name (ProcessGroup keeps a
        # group's name in its backends, and DeviceMesh, FSDP2 and functional
        # collectives find groups by name)
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, self._gloo)

    def getBackendName(self) -> str:
        return BACKEND

    def _reduce_op(self, opts, dtypes):
        """Gloo has no AVG: SUM, then divide by the group size (floating tensors only)."""
        op = opts.reduceOp if opts is not None else _SUM
        if op != dist.ReduceOp.AVG:
            return op, False
        bad = [d for d in dtypes if not (d.is_floating_point or d.is_complex)]
        if bad:
            raise ValueError(f"tpu_dist: ReduceOp.AVG needs floating tensors, got {bad[0]}")
        return _SUM, True

    # -- collectives ------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        if not isinstance(tensors, list):
            tensors = [tensors]
        op, avg = self._reduce_op(opts, [t.dtype for t in tensors])
        staged = _stage(tensors, "all_reduce")
        o = dist.AllreduceOptions()
        o.reduceOp = op
        self._gloo.allreduce(staged, o).wait()
        if avg:
            for s in staged:
                s.div_(self.size())
        _unstage(tensors, staged)
        return _done(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        for t in tensors:
            self.allreduce([t], opts)
        return _done(tensors)

    def broadcast(self, tensors, opts=None):
        if not isinstance(tensors, list):
            tensors = [tensors]
        staged = _stage(tensors, "broadcast")
        o = dist.BroadcastOptions()
        if opts is not None:
            o.rootRank, o.rootTensor = opts.rootRank, opts.rootTensor
        self._gloo.broadcast(staged, o).wait()
        _unstage(tensors, staged)
        return _done(tensors)

    def allgather(self, output_lists, inputs, opts=None):
        staged_in = _stage(inputs, "all_gather")
        staged_out = [_buffers(outs) for outs in output_lists]
        self._gloo.allgather(staged_out, staged_in).wait()
        for outs, st in zip(output_lists, staged_out):
            _unstage(outs, st)
        return _done(output_lists)

    def _allgather_base(self, output, input, opts=None):
        (inp,) = _stage([input], "all_gather_into_tensor")
        out = torch.empty(output.shape, dtype=output.dtype)
        self._gloo.allgather([_rank_blocks(out, self.size(), inp.shape)], [inp.contiguous()]).wait()
        output.copy_(out)
        return _done([output])

    def reduce(self, tensors, opts=None):
        op, avg = self._reduce_op(opts, [t.dtype for t in tensors])
        staged = _stage(tensors, "reduce")
        o = dist.ReduceOptions()
        o.reduceOp = op
        if opts is not None:
            o.rootRank, o.rootTensor = opts.rootRank, opts.rootTensor
        self._gloo.reduce(staged, o).wait()
        if avg and self.rank() == o.rootRank:
            for s in staged:
                s.div_(self.size())
        _unstage(tensors, staged)
        return _done(tensors)

    def _reduce_scatter_base(self, output, input, opts=None):
        """All-reduce of the whole input, then this rank's block (Gloo's transport)."""
        (inp,) = _stage([input], "reduce_scatter_tensor")
        o = dist.AllreduceOptions()
        op, avg = self._reduce_op(opts, [inp.dtype])
        o.reduceOp = op
        inp = inp.contiguous().clone()
        self._gloo.allreduce([inp], o).wait()
        mine = _rank_blocks(inp, self.size(), output.shape)[self.rank()]
        if avg:
            mine = mine / self.size()
        output.copy_(mine)
        return _done([output])

    def reduce_scatter(self, outputs, input_lists, opts=None):
        for out, ins in zip(outputs, input_lists):
            self._reduce_scatter_base(out, torch.stack(list(ins)), opts)
        return _done(outputs)

    def gather(self, output_lists, inputs, opts=None):
        staged_in = _stage(inputs, "gather")
        staged_out = [_buffers(outs) for outs in output_lists]
        o = dist.GatherOptions()
        if opts is not None:
            o.rootRank = opts.rootRank
        self._gloo.gather(staged_out, staged_in, o).wait()
        for outs, st in zip(output_lists, staged_out):
            _unstage(outs, st)
        return _done(output_lists)

    def scatter(self, outputs, input_lists, opts=None):
        staged_out = _buffers(outputs)
        staged_in = [_stage(ins, "scatter") for ins in input_lists]
        o = dist.ScatterOptions()
        if opts is not None:
            o.rootRank = opts.rootRank
        self._gloo.scatter(staged_out, staged_in, o).wait()
        _unstage(outputs, staged_out)
        return _done(outputs)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        (inp,) = _stage([input], "all_to_all_single")
        out = torch.empty(output.shape, dtype=output.dtype)
        self._gloo.alltoall_base(out, inp.contiguous(), output_split_sizes, input_split_sizes).wait()
        output.copy_(out)
        return _done([output])

    def gather_single(self, output, input, opts=None):
        """Gather into one tensor at the root (gather_into_tensor)."""
        (inp,) = _stage([input], "gather_into_tensor")
        root = opts.rootRank if opts is not None else 0
        o = dist.GatherOptions()
        o.rootRank = root
        if self.rank() == root:
            out = torch.empty(output.shape, dtype=output.dtype)
            self._gloo.gather([_rank_blocks(out, self.size(), inp.shape)], [inp.contiguous()], o).wait()
            output.copy_(out)
        else:
            self._gloo.gather([], [inp.contiguous()], o).wait()
        return _done([output])

    # the names torch.distributed's newer entry points call
    all_gather_single = _allgather_base
    reduce_scatter_single = _reduce_scatter_base
    all_to_all_single = alltoall_base

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        for out, inp in zip(outputs, inputs):
            self._allgather_base(out, inp, opts)
        return _done(outputs)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        for out, inp in zip(outputs, inputs):
            self._reduce_scatter_base(out, inp, opts)
        return _done(outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def barrier(self, opts=None):
        self._gloo.barrier(opts if opts is not None else dist.BarrierOptions()).wait()
        return _done(None)

    def send(self, tensors, dst, tag=0):
        self._gloo.send(_stage(tensors, "send"), dst, tag).wait()
        return _done(tensors)

    def recv(self, tensors, src, tag=0):
        staged = _buffers(tensors)
        self._gloo.recv(staged, src, tag).wait()
        _unstage(tensors, staged)
        return _done(tensors)


def _create(opts, backend_options):
    pg = TpuDistProcessGroup(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    pg._set_group_name(opts.group_id)  # DeviceMesh (FSDP2, DTensor) finds groups by name
    return pg


def register() -> None:
    """Makes "tpu_dist" a torch.distributed backend and the default one for tpu."""
    if BACKEND.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "tpu"])
