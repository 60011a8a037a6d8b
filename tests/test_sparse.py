"""Sparse layouts on tpu (COO and the compressed ones): sparse tpu tensors are ATen's sparse
impls with tpu members; construction and structure queries are native, every other op
runs through the counted CPU fallback. Results are compared with PyTorch CPU."""
import pytest
import torch

import torchtpu

DENSE = torch.tensor([[0.0, 1.5, 0.0, 0.0], [2.0, 0.0, -3.0, 0.0], [0.0, 0.0, 0.0, 4.0]])


@pytest.fixture(autouse=True)
def _allow_fallback():
    mode = torchtpu.get_fallback()
    torchtpu.set_fallback("allow")
    yield
    torchtpu.set_fallback(mode)


def same(tpu_result, cpu_result):
    assert tpu_result.device.type == "tpu"
    assert tpu_result.layout == cpu_result.layout
    got = tpu_result.cpu()
    if got.layout != torch.strided:
        got, cpu_result = got.to_dense(), cpu_result.to_dense()
    torch.testing.assert_close(got, cpu_result)


def test_coo_members_live_on_tpu_and_round_trip():
    s = DENSE.to_sparse().to("tpu")
    assert s.layout == torch.sparse_coo and s.device.type == "tpu"
    assert s._indices().device.type == "tpu" and s._values().device.type == "tpu"
    assert s._nnz() == 4 and s.sparse_dim() == 2 and s.dense_dim() == 0
    back = s.cpu()
    assert back.layout == torch.sparse_coo
    torch.testing.assert_close(back.to_dense(), DENSE)
    same(DENSE.to("tpu").to_sparse(), DENSE.to_sparse())
    same(s.to_dense(), DENSE)


@pytest.mark.parametrize("layout", ["csr", "csc", "bsr"])
def test_compressed_layouts_round_trip(layout):
    conv = {"csr": lambda t: t.to_sparse_csr(), "csc": lambda t: t.to_sparse_csc(),
            "bsr": lambda t: t.to_sparse_bsr((1, 2))}[layout]
    c = conv(DENSE).to("tpu")
    assert c.device.type == "tpu" and c.values().device.type == "tpu"
    same(c, conv(DENSE))
    same(conv(DENSE.to("tpu")), conv(DENSE))
    same(c.to_dense(), DENSE)


def test_sparse_ops_run_on_the_host_and_are_counted():
    s, d = DENSE.to_sparse(), torch.arange(8.0).reshape(4, 2)
    st, dt = s.to("tpu"), d.to("tpu")
    torchtpu.reset_fallback_report()
    same(st + st, s + s)
    same(st * 2, s * 2)
    same(torch.sparse.mm(st, dt), torch.sparse.mm(s, d))
    same(st @ dt, s @ d)
    same(st.coalesce(), s.coalesce())
    same(torch.sparse.sum(st), torch.sparse.sum(s))
    same(st.t(), s.t())
    c = DENSE.to_sparse_csr()
    same(c.to("tpu") @ dt, c @ d)
    report = torchtpu.fallback_report()
    assert report.get("aten::add.Tensor") and report.get("aten::mm")


def test_in_place_and_copy_into_sparse_tpu_tensors():
    s = DENSE.to_sparse()
    st = s.to("tpu")
    st.add_(st)
    same(st, s + s)
    assert st._values().device.type == "tpu"
    other = (DENSE * 3).to_sparse()
    st.copy_(other)
    same(st, other)


def test_sparse_mm_reduce_backward():
    """The reduce's backward reads the argmax the forward saves only when an input
    requires grad: the host copies keep requires_grad (without, the CPU kernel crashed)."""
    torch.manual_seed(0)
    a = torch.randn(5, 5)
    a[a < 0] = 0
    for reduce in ["sum", "mean", "amax", "amin"]:
        grads = []
        for dev in ["cpu", "tpu"]:
            c = a.to_sparse_csr().to(dev).requires_grad_()
            d = torch.randn(5, 3, generator=torch.Generator().manual_seed(1)).to(dev).requires_grad_()
            out = torch.sparse.mm(c, d, reduce)
            grads.append(torch.autograd.grad(out.sum(), [c, d]))
        for g_tpu, g_cpu in zip(grads[1], grads[0]):
            same(g_tpu, g_cpu)


def test_to_sparse_backward():
    grads = []
    for dev in ["cpu", "tpu"]:
        x = DENSE.clone().to(dev).requires_grad_()
        grads.append(torch.autograd.grad(torch.sparse.sum(x.to_sparse() * 2), x)[0])
    same(grads[1], grads[0])  # masked: 2 where DENSE has an element, 0 elsewhere
    assert grads[1].cpu().count_nonzero() == DENSE.count_nonzero()


def test_sparse_op_with_fallback_disabled_names_the_op():
    st = DENSE.to_sparse().to("tpu")
    torchtpu.set_fallback("error")
    with pytest.raises(NotImplementedError, match="add.Tensor"):
        st + st


@pytest.mark.parametrize("opt", ["sgd", "sparse_adam"])
def test_sparse_embedding_training_matches_cpu(opt):
    """nn.Embedding(sparse=True) gives sparse COO gradients; SGD and SparseAdam step with
    them on tpu as on CPU."""
    out = []
    for dev in ["cpu", "tpu"]:
        torch.manual_seed(0)
        emb = torch.nn.Embedding(10, 4, sparse=True).to(dev)
        o = (torch.optim.SGD(emb.parameters(), lr=0.1) if opt == "sgd"
             else torch.optim.SparseAdam(emb.parameters(), lr=0.1))
        for _ in range(3):
            idx = torch.tensor([[1, 2, 4], [4, 3, 9]], device=dev)
            loss = emb(idx).pow(2).sum()
            o.zero_grad()
            loss.backward()
            assert emb.weight.grad.layout == torch.sparse_coo
            o.step()
        out.append(emb.weight.detach().cpu())
    torch.testing.assert_close(out[1], out[0])


def test_sparse_constructors_on_tpu():
    i = torch.tensor([[0, 1, 1], [2, 0, 2]], device="tpu")
    v = torch.tensor([3.0, 4.0, 5.0], device="tpu")
    s = torch.sparse_coo_tensor(i, v, (2, 3))
    assert s.device.type == "tpu" and "nnz=3" in repr(s)
    same(s.to_dense(), torch.sparse_coo_tensor(i.cpu(), v.cpu(), (2, 3)).to_dense())
    c = torch.sparse_csr_tensor(torch.tensor([0, 2, 4]), torch.tensor([0, 1, 0, 1]),
                                torch.tensor([1.0, 2.0, 3.0, 4.0]), device="tpu")
    assert c.crow_indices().device.type == "tpu"
    torch.testing.assert_close(c.to_dense().cpu(), torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
