"""torchvision's detection ops on tpu against torchvision's CPU kernels: nms (also through
batched_nms), roi_align forward and backward (aligned or not, fixed and adaptive sampling
ratio, spatial scales, boxes partly or wholly outside the feature map, degenerate boxes).
Every case checks that the native kernel ran (not the CPU fallback)."""
import contextlib
import warnings

import pytest
import torch

import torchtpu
from op_helpers import close, native, tpu

torchvision = pytest.importorskip("torchvision")
from torchvision.ops import batched_nms, nms, roi_align  # noqa: E402

NMS = "torchvision::nms"
ROI = ("torchvision::roi_align", "torchvision::_roi_align_backward")


def _boxes(n, seed, spread=30.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * spread
    wh = torch.rand(n, 2, generator=g) * spread / 3
    return torch.cat([xy, xy + wh], 1).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [0, 1, 7, 300])
@pytest.mark.parametrize("thr", [0.0, 0.3, 0.7, 1.0])
def test_nms_matches_cpu(dtype, n, thr):
    boxes = _boxes(n, n, dtype=dtype)
    scores = torch.rand(n, generator=torch.Generator().manual_seed(1)).to(dtype)
    want = nms(boxes, scores, thr)
    with native(NMS):
        got = nms(*tpu(boxes, scores), thr)
    assert got.device.type == "tpu" and got.dtype == torch.int64
    assert torch.equal(got.cpu(), want), (got.cpu(), want)


def test_nms_ties_duplicates_and_degenerate_boxes():
    # equal scores keep index order (a stable descending sort), identical boxes suppress
    # each other, zero-area and inverted boxes never overlap
    boxes = torch.tensor([[0, 0, 10, 10], [0, 0, 10, 10], [1, 1, 11, 11], [5, 5, 5, 9],
                          [8, 8, 2, 2], [0, 0, 10, 10], [20, 20, 30, 30], [21, 21, 30, 30]], dtype=torch.float32)
    for scores in ([0.5] * 8, [0.9, 0.9, 0.8, 0.95, 0.95, 0.9, 0.1, 0.1]):
        s = torch.tensor(scores)
        for thr in (0.0, 0.5, 0.99):
            want = nms(boxes, s, thr)
            with native(NMS):
                got = nms(*tpu(boxes, s), thr)
            assert torch.equal(got.cpu(), want), (scores, thr, got.cpu(), want)


def test_nms_nan_scores_come_first():
    boxes = _boxes(8, 4)
    s = torch.tensor([0.2, float("nan"), 0.3, 0.1, 0.4, float("nan"), 0.5, 0.6])
    want = nms(boxes, s, 0.3)
    debug = torchtpu.get_eager_mode() == "debug"
    if debug:  # debug mode's NaN check refuses NaN values when set to raise
        with torchtpu.set_debug_options(nan="raise"), pytest.raises(RuntimeError, match="NaN"):
            tpu(s)
            torch.tpu.synchronize()
    with torchtpu.set_debug_options(nan="warn") if debug else contextlib.nullcontext(), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with native(NMS):
            got = nms(*tpu(boxes, s), 0.3)
    assert torch.equal(got.cpu(), want), (got.cpu(), want)


def test_nms_strided_inputs():
    boxes = _boxes(64, 3).t().contiguous().t()          # column-major
    scores = torch.rand(128, generator=torch.Generator().manual_seed(2))[::2]
    want = nms(boxes, scores, 0.4)
    with native(NMS):
        got = nms(*tpu(boxes, scores), 0.4)
    assert torch.equal(got.cpu(), want)


def test_batched_nms_matches_cpu():
    boxes = _boxes(200, 5, spread=60.0)
    scores = torch.rand(200, generator=torch.Generator().manual_seed(6))
    idxs = torch.randint(0, 4, (200,), generator=torch.Generator().manual_seed(7))
    want = batched_nms(boxes, scores, idxs, 0.5)
    with native(NMS):
        got = batched_nms(*tpu(boxes, scores, idxs), 0.5)
    assert torch.equal(got.cpu(), want)


def test_nms_errors_match_cpu():
    good = torch.zeros(3, 4), torch.zeros(3)
    bad = [(torch.zeros(3, 5), torch.zeros(3), "boxes should have 4 elements in dimension 1, got 5"),
           (torch.zeros(12), torch.zeros(3), "boxes should be a 2d tensor, got 1D"),
           (good[0], torch.zeros(3, 1), "scores should be a 1d tensor, got 2D"),
           (good[0], torch.zeros(4), "boxes and scores should have same number of elements in dimension 0, "
                                     "got 3 and 4"),
           (good[0], torch.zeros(3, dtype=torch.float64), "dets should have the same type as scores")]
    for b, s, msg in bad:
        with pytest.raises(RuntimeError, match=msg):
            torch.ops.torchvision.nms(b, s, 0.5)
        with pytest.raises(RuntimeError, match=msg):
            torch.ops.torchvision.nms(*tpu(b, s), 0.5)


def _rois(k, n_img, seed, h, w, dtype):
    """Boxes in image coordinates (scale 1/stride applies), some off the map, some tiny,
    some inverted, and the batch index of each."""
    g = torch.Generator().manual_seed(seed)
    x1 = torch.rand(k, generator=g) * (w * 1.4) - w * 0.2
    y1 = torch.rand(k, generator=g) * (h * 1.4) - h * 0.2
    bw = torch.rand(k, generator=g) * w * 0.8
    bh = torch.rand(k, generator=g) * h * 0.8
    bw[::7] = 0.3                      # smaller than a pixel
    bh[3::9] = -2.0                    # inverted
    idx = torch.randint(0, n_img, (k,), generator=g).float()
    return torch.stack([idx, x1, y1, x1 + bw, y1 + bh], 1).to(dtype)


CASES = [  # (output size, spatial_scale, sampling_ratio, aligned)
    ((7, 7), 0.25, 2, False),
    ((7, 7), 0.25, 2, True),
    ((5, 3), 0.5, -1, True),
    ((5, 3), 0.5, 0, False),
    ((2, 2), 1.0, 3, True),
    ((4, 4), 0.125, -1, False),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0][0]}x{c[0][1]}-s{c[1]}-r{c[2]}-a{int(c[3])}" for c in CASES])
def test_roi_align_forward_backward(dtype, case):
    size, scale, ratio, aligned = case
    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, 5, 13, 17, generator=g).to(dtype).requires_grad_()
    rois = _rois(23, 2, 12, 13 / scale, 17 / scale, dtype)
    want = roi_align(x, rois, size, scale, ratio, aligned)
    gout = torch.randn(want.shape, generator=g).to(dtype)
    (want_gx,) = torch.autograd.grad(want, x, gout)
    xt, rt = tpu(x, rois)
    with native(*ROI):
        got = roi_align(xt, rt, size, scale, ratio, aligned)
        (got_gx,) = torch.autograd.grad(got, xt, gout.to("tpu"))
    close(got, want.detach())
    close(got_gx, want_gx)


def test_roi_align_box_list_and_strided_input():
    x = torch.randn(3, 4, 9, 11, generator=torch.Generator().manual_seed(3)).permute(0, 1, 3, 2)  # strided
    boxes = [_boxes(5, 1, spread=8.0), _boxes(0, 2), _boxes(4, 3, spread=8.0)]
    want = roi_align(x, boxes, (3, 2), 1.0, 2, True)
    with native(*ROI):
        got = roi_align(tpu(x), [tpu(b) for b in boxes], (3, 2), 1.0, 2, True)
    close(got, want)


def test_roi_align_empty_rois_and_zero_grid():
    x = torch.randn(1, 3, 6, 6, requires_grad=True)
    for rois in (torch.zeros(0, 5), torch.tensor([[0, 2.0, 2.0, 2.0, 2.0]])):  # the second: adaptive grid 0
        want = roi_align(x, rois, (2, 2), 1.0, -1, True)
        xt = tpu(x)
        with native(*ROI):
            got = roi_align(xt, tpu(rois), (2, 2), 1.0, -1, True)
            close(got, want.detach())
            if got.numel():
                (gx,) = torch.autograd.grad(got.sum(), xt)
                close(gx, torch.autograd.grad(want.sum(), x)[0])


def test_roi_align_errors():
    x = torch.randn(1, 2, 5, 5)
    with pytest.raises(RuntimeError, match=r"rois must have shape as Tensor\[K, 5\]"):
        torch.ops.torchvision.roi_align(tpu(x), tpu(torch.zeros(2, 4)), 1.0, 2, 2, 2, False)
    with pytest.raises(RuntimeError, match="input should have the same type as rois"):
        torch.ops.torchvision.roi_align(tpu(x), tpu(torch.zeros(2, 5, dtype=torch.float64)), 1.0, 2, 2, 2, False)
    # a batch index outside the batch: an error (on CPU it reads out of bounds)
    with pytest.raises(IndexError, match="batch index"):
        out = torch.ops.torchvision.roi_align(tpu(x), tpu(torch.tensor([[3.0, 0, 0, 2, 2]])), 1.0, 2, 2, 2, False)
        out.cpu()
    torch.tpu.synchronize()


def test_autocast_runs_in_float32_like_cpu():
    # torchvision's CPU and CUDA autocast kernels run nms and roi_align in float32 (its
    # CPU roi_align has no bfloat16 kernel at all); tpu does the same
    x = torch.randn(2, 4, 9, 9, generator=torch.Generator().manual_seed(5))
    rois = _rois(6, 2, 6, 9.0, 9.0, torch.float32)
    boxes, scores = _boxes(40, 8), torch.rand(40, generator=torch.Generator().manual_seed(9))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = roi_align(x.bfloat16(), rois, (3, 3), 1.0, 2, True)
        want_keep = nms(boxes.bfloat16(), scores.bfloat16(), 0.4)
    with native(NMS, *ROI), torch.autocast("tpu", dtype=torch.bfloat16):
        got = roi_align(tpu(x).bfloat16(), tpu(rois), (3, 3), 1.0, 2, True)
        keep = nms(tpu(boxes).bfloat16(), tpu(scores).bfloat16(), 0.4)
    close(got, want)
    assert torch.equal(keep.cpu(), want_keep)
