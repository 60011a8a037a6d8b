"""The benchmark report's tables and PNG plots (torchtpu/bench.py, torchtpu/_bench_plots.py),
rendered from a small made-up results dict: nothing is measured here."""
import json
import sys

import pytest

from torchtpu import _bench_plots, bench

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def gpt(device, first, steady, tok):
    return {"model": "GPT d=64", "device": device, "first_step_s": first, "steady_step_s": steady,
            "train_tokens_s": tok, "flops_per_token": 1e6, "prefill_tokens_s": 2 * tok, "decode_tokens_s": 3.0,
            "config": {"d": 64, "heads": 2, "layers": 1, "ctx": 8, "batch": 1, "steps": 3}}


def results():
    gemm = [{"op": "matmul sq 64x64x64", "dtype": "float32", "tpu": 80e9, "cpu": 40e9},
            {"op": "matmul sq 64x64x64", "dtype": "bfloat16", "tpu": 300e9, "cpu": 150e9}]
    bw = [{"op": "add", "dtype": "float32", "tpu": 24e9, "cpu": 12e9}]
    xla = dict(gpt("cpu (pytorch/xla)", 5.0, 0.5, 50.0), step_times_s=[5.0, 0.5, 0.5],
               step_compilations=[1, 0, 0], torch="2.9.0", torch_xla="2.9.0", pjrt_device="CPU")
    return {
        "torch": "2.14.1",
        "machine": {"cores": 2, "vector_width": 16, "flops_1": 50e9, "flops_all": 100e9, "bf16_flops_1": 200e9,
                    "bf16_flops_all": 400e9, "copy_1": 20e9, "copy_all": 30e9, "triad_1": 20e9, "triad_all": 30e9,
                    "peak_flags": "-march=native", "model": "test CPU", "ram_gib": 8.0},
        "micro": {"threads": 2, "gemm": gemm, "bw": bw,
                  "dispatch": [{"op": "add of 16-element tensors, tpu strict", "tpu": 2e-6, "cpu": 1e-6}]},
        "scaling": [{"threads": 1, "gemm": [dict(gemm[0], tpu=40e9, cpu=30e9)], "bw": [dict(bw[0], tpu=16e9, cpu=6e9)]},
                    {"threads": 2, "gemm": gemm[:1], "bw": bw}],
        "models": [gpt("tpu", 0.25, 0.2, 400.0), gpt("cpu", 0.5, 0.4, 200.0)],
        "models_xla": [xla],
    }


def bar_widths(fig, ax_index=0):
    """Bar lengths per legend entry, in drawing order."""
    ax = fig.axes[ax_index]
    return {c.get_label(): [p.get_width() for p in c.patches] for c in ax.containers}


def test_report_embeds_every_plot(tmp_path):
    out = tmp_path / "benchmarks.md"
    bench.write_report(str(out), "python -m torchtpu.bench", results(), "2026-12-06 00:00", 60.0, ["0 / 0 / 0"] * 2)
    text = out.read_text()
    for name in ("gemm", "bandwidth", "dispatch", "scaling", "models"):
        assert f"](plots/{name}.png)" in text, name
        png = (tmp_path / "plots" / f"{name}.png").read_bytes()
        assert png.startswith(PNG_MAGIC) and len(png) > 5000, name
    # the tables are still there, with the same figures the plots draw
    assert "| sq 64x64x64 | bfloat16 | 300.0 | 75% | 150.0 | 38% | 2.00x |" in text
    assert "| GPT d=64 | 0.25 / 5.00 | 20.00x | 0.20 / 0.50 | 2.50x |" in text


def test_plots_draw_the_table_figures():
    import matplotlib.pyplot as plt
    r = results()
    fig = _bench_plots.gemm_figure(r)
    # f32 against the f32 peak (100 GFLOP/s), bf16 against the bf16 peak (400)
    assert bar_widths(fig) == {"tpu": pytest.approx([80.0, 75.0]), "PyTorch CPU eager": pytest.approx([40.0, 37.5])}
    plt.close(fig)
    fig = _bench_plots.bandwidth_figure(r)
    assert bar_widths(fig)["tpu"] == pytest.approx([24.0])
    lines = sorted(line.get_xdata()[0] for line in fig.axes[0].lines)
    assert lines == pytest.approx([24.0, 30.0])  # 80% of the copy bandwidth, the copy bandwidth
    plt.close(fig)
    fig = _bench_plots.scaling_figure(r)
    assert bar_widths(fig) == {"tpu": pytest.approx([2.0, 1.5]), "PyTorch CPU eager": pytest.approx([40 / 30, 2.0])}
    plt.close(fig)
    fig = _bench_plots.models_figure(r)
    widths = bar_widths(fig, 1)  # first step
    assert widths["tpu"] == pytest.approx([0.25]) and widths["PyTorch/XLA (PJRT_DEVICE=CPU)"] == pytest.approx([5.0])
    target = [line for line in fig.axes[1].lines if "1/10" in line.get_label()]
    assert len(target) == 1 and list(target[0].get_xdata()) == pytest.approx([0.5, 0.5])
    plt.close(fig)


def test_from_json_renders_without_measuring(tmp_path, monkeypatch):
    r = dict(results(), cmd="python -m torchtpu.bench", started="2026-12-06 00:00", elapsed_s=60.0,
             loads=["0 / 0 / 0", "1 / 1 / 1"])
    raw = tmp_path / "benchmarks.json"
    raw.write_text(json.dumps(r))
    out = tmp_path / "report" / "benchmarks.md"
    monkeypatch.setattr(sys, "argv", ["bench", "--from-json", str(raw), "--out", str(out)])
    monkeypatch.setattr(bench, "run_script", lambda *a, **k: pytest.fail("--from-json measured something"))
    bench.main()
    assert "Run 2026-12-06 00:00 (1.0 min)" in out.read_text()
    assert (tmp_path / "report" / "plots" / "models.png").read_bytes().startswith(PNG_MAGIC)


def test_modes_plot_and_section(tmp_path):
    """bench/modes.py's plot (speed over strict, issue 4's targets, peak memory) and its
    --write, which replaces the section's own text in place and keeps its subsections."""
    import matplotlib.pyplot as plt
    rows = [{"name": "GPT training step", "strict_s": 3.0, "defer_s": 2.0, "cpu_s": 4.0, "peak_strict": 2 * 2**20,
             "peak_defer": 2**20},
            {"name": "MLP", "strict_s": 1.0, "defer_s": 0.25, "cpu_s": 0.5, "peak_strict": 2**20, "peak_defer": 0}]
    fig = _bench_plots.modes_figure(rows)
    assert bar_widths(fig) == {"defer_and_fuse": pytest.approx([1.5, 4.0]), "PyTorch CPU eager": pytest.approx([0.75, 2.0])}
    goals = [line.get_xdata()[0] for line in fig.axes[0].lines if line.get_linestyle() == "--"]
    assert goals == pytest.approx([1.5, 2.0])
    assert bar_widths(fig, 1) == {"strict": pytest.approx([2.0, 1.0]), "defer_and_fuse": pytest.approx([1.0, 0.0])}
    plt.close(fig)

    sys.path.insert(0, bench.BENCH)
    try:
        import modes
    finally:
        sys.path.pop(0)
    doc = tmp_path / "b.md"
    doc.write_text("# B\n\n## Eager modes\n\nold table\n\n### Stop 15\n\nkept\n\n## Next\n\nx\n")
    modes._replace_section(str(doc), "## Eager modes", "## Eager modes\n\nnew table\n")
    assert doc.read_text() == "# B\n\n## Eager modes\n\nnew table\n\n### Stop 15\n\nkept\n\n## Next\n\nx\n"
