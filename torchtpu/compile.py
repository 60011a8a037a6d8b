"""torch.compile on the tpu device: the Dynamo backend "tpu".

    model = torch.compile(model, backend="tpu")   # or plain torch.compile(model)

Dynamo captures each region of the Python program; AOTAutograd turns the region into
functional ATen graphs (the forward and, when gradients are needed, the backward, run by
autograd as one node instead of op by op). Each graph runs on the device through the
same IR nodes as eager execution, in the current eager mode: in defer_and_fuse (the
default) a region's ops are cut, fused and memory-planned as graphs whose plans the
runtime caches, so from the second call on a region does no planning. The Python-level
work of the model (module calls, hooks, Python control flow) is gone from the step; the
per-op dispatch of the ATen graph remains. There is no code generation.

Inductor's own code generator for a device named "tpu" is Pallas (Google TPUs through
JAX), which cannot run here: a plain `torch.compile(model)` (backend "inductor") of a
region whose inputs are on tpu is compiled by this backend instead, so CUDA code moves
to tpu without changing its torch.compile calls. Regions on other devices still go to
Inductor.
"""
from __future__ import annotations

import torch

_installed = False


def _has_tpu_input(inputs) -> bool:
    return any(isinstance(t, torch.Tensor) and t.device.type == "tpu" for t in inputs)


def _views_to_reshapes(gm: torch.fx.GraphModule) -> None:
    """The graph was traced with PyTorch's meta functions, whose output strides can differ
    from the runtime's kernels (e.g. the fused attention's meta output follows the
    query's dim order; libtpurt's is contiguous), so a `view` that was valid while tracing
    can be invalid on the device. The graph is functional (AOTAutograd removed mutation),
    so a view and a reshape mean the same values: reshape copies only where the layout
    requires it."""
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.view.default:
            node.target = torch.ops.aten.reshape.default
            changed = True
        elif node.op == "call_function" and node.target is torch.ops.aten._unsafe_view.default:
            node.target = _unsafe_view
            changed = True
    if changed:
        gm.recompile()


def _unsafe_view(x, shape):
    """aten._unsafe_view where the layout allows it, else a reshape (which then copies).
    Not a plain reshape: _unsafe_view's result is not a view for autograd, and a graph
    output that became one (a model's logits, made by reshaping a matmul's result) would
    be refused an in-place write afterwards ("Output 0 of CompiledFunction is a view ...":
    Chameleon's `logits[:, :, image_tokens] = min`)."""
    try:
        return torch.ops.aten._unsafe_view.default(x, shape)
    except RuntimeError:
        return torch.ops.aten.reshape.default(x, shape)


def _graph_runner(gm: torch.fx.GraphModule, example_inputs):
    """AOTAutograd's compiler for one ATen graph: the graph itself (after the view
    rewrite), called with its arguments as a list (AOTAutograd's boxed convention)."""
    from torch._functorch.aot_autograd import make_boxed_func
    _views_to_reshapes(gm)
    return make_boxed_func(gm.forward)


def tpu_backend(gm: torch.fx.GraphModule, example_inputs):
    """The Dynamo backend registered as "tpu"."""
    from torch._dynamo.backends.common import aot_autograd
    return aot_autograd(fw_compiler=_graph_runner, bw_compiler=_graph_runner)(gm, example_inputs)


def _grouped_mm_fake(fake_mode, func, *args, **kwargs):
    """FakeTensor rule of aten._grouped_mm for tpu tensors. PyTorch's meta function
    carries CUDA's limits (bfloat16, or float16 with cuBLASLt), so tracing a model that
    calls it in float32 fails ("Expected mat_a to be BFloat16 ..."), though the op runs on
    tpu in every float dtype (its CompositeExplicitAutograd kernel, mm per group), and
    transformers' MoE layers call it on tpu in any dtype (integrations/moe.py). This rule
    checks what the shapes need (dims, dtypes, the contraction, offsets where an operand
    is 2-d) and takes the output's shape from PyTorch's own helper; what only the values
    or the layout decide (offsets in range, 16-byte strides) the kernel checks when the
    graph runs. Other devices keep PyTorch's rule."""
    from torch._meta_registrations import _create_grouped_mm_output_tensor
    from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

    def parse(self, mat2, offs=None, bias=None, out_dtype=None):
        return self, mat2, offs, bias, out_dtype

    a, b, offs, bias, out_dtype = parse(*args, **kwargs)
    if a.device.type != "tpu" or not a.is_floating_point():
        return NotImplemented
    torch._check(a.dim() in (2, 3) and b.dim() in (2, 3),
                 lambda: f"_grouped_mm: operands must be 2-d or 3-d, got {a.dim()}-d and {b.dim()}-d")
    torch._check(b.dtype == a.dtype, lambda: f"_grouped_mm: mat2 dtype {b.dtype} does not match self dtype {a.dtype}")
    torch._check(out_dtype in (None, a.dtype), lambda: f"_grouped_mm: out_dtype must be {a.dtype}, got {out_dtype}")
    torch._check(bias is None, lambda: "_grouped_mm: bias is not supported")
    torch._check(a.size(-1) == b.size(-2),
                 lambda: f"_grouped_mm: contraction sizes differ ({a.size(-1)} and {b.size(-2)})")
    if a.dim() == 2 or b.dim() == 2:
        torch._check(offs is not None and offs.dim() == 1 and offs.dtype == torch.int32,
                     lambda: "_grouped_mm: a 2-d operand needs 1-d int32 offsets")
    else:
        torch._check(offs is None, lambda: "_grouped_mm: offsets given for 3-d operands")
    with in_kernel_invocation_manager(fake_mode):
        shape = _create_grouped_mm_output_tensor(a, b, offs, a.dtype).shape
        out = torch.empty(shape, dtype=a.dtype, device="meta")
    return FakeTensor(fake_mode, out, a.device)


def install() -> None:
    """Routes Inductor's regions with tpu inputs to the "tpu" backend. Called by `import
    torchtpu`; imports nothing of torch._dynamo (the backend itself is registered through
    the package's `torch_dynamo_backends` entry point, which Dynamo reads when it first
    looks a backend up)."""
    global _installed
    if _installed:
        return
    _installed = True
    from torch._subclasses import fake_impls  # (imported by torch itself)
    grouped_mm = torch.ops.aten._grouped_mm.default
    fake_impls.register_op_impl(lambda func: func is grouped_mm)(_grouped_mm_fake)
    inductor_call = torch._TorchCompileInductorWrapper.__call__

    def __call__(self, model_, inputs_, **kw):
        if _has_tpu_input(inputs_):
            return tpu_backend(model_, inputs_)
        return inductor_call(self, model_, inputs_, **kw)

    __call__.__wrapped__ = inductor_call
    torch._TorchCompileInductorWrapper.__call__ = __call__
