"""The GPT benchmark sizes, shared by bench/models.py (tpu, CPU eager, Inductor) and
bench/xla_gpt.py (PyTorch/XLA, in its own venv). Imports nothing, so either side can use it."""

GPT_CONFIGS = [  # sized so the whole suite stays within minutes on 2 cores
    {"name": "GPT d=512", "d": 512, "heads": 8, "layers": 4, "ctx": 128, "batch": 4, "steps": 5},
    {"name": "GPT d=1024", "d": 1024, "heads": 16, "layers": 4, "ctx": 128, "batch": 2, "steps": 4},
]


def gpt_train_flops_per_token(model, cfg):
    """6 N (weights, forward + backward) + 12 * layers * ctx * d (attention scores/values)."""
    n = sum(p.numel() for name, p in model.named_parameters() if not name.startswith("pos"))
    return 6 * n + 12 * cfg["layers"] * cfg["ctx"] * cfg["d"]
