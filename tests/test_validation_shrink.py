"""The validator's model shrinker (torchtpu/_validate/models.py) keeps tied config fields
consistent, so that a model is tested instead of excluded for the shrinker's own mistakes.
CPU only; needs transformers and timm (skipped without them)."""
import pytest

pytest.importorskip("transformers")
pytest.importorskip("timm")

from transformers import AutoConfig  # noqa: E402

from torchtpu._validate import models as M  # noqa: E402


def _shrunk(model_type):
    return M._shrink_dict(AutoConfig.for_model(model_type).to_dict())


def test_full_attention_keeps_as_many_kv_heads_as_heads():
    d = _shrunk("deepseek_v3")  # 128 heads, 128 key/value heads
    assert d["num_key_value_heads"] == d["num_attention_heads"]
    assert d["qk_head_dim"] == d["qk_nope_head_dim"] + d["qk_rope_head_dim"]


def test_every_layer_type_is_kept():
    full = AutoConfig.for_model("gemma4_text").to_dict()
    d = M._shrink_dict(dict(full))
    assert set(d["layer_types"]) == set(full["layer_types"])
    assert len(d["layer_types"]) == d["num_hidden_layers"]
    # per-layer overrides follow the kept layers
    assert all(0 <= int(k) < d["num_hidden_layers"] for k in d.get("per_layer_config") or {})


def test_mamba_heads_span_the_inner_width():
    d = _shrunk("bamba")
    assert d["mamba_n_heads"] * d["mamba_d_head"] == d["mamba_expand"] * d["hidden_size"]


def test_mrope_sections_sum_to_half_the_rotary_dim():
    b = M.build("hf/qwen2_vl/Qwen2VLModel")
    text = b.model.config.text_config
    head_dim = text.hidden_size // text.num_attention_heads
    assert sum(text.rope_parameters["mrope_section"]) == head_dim // 2


@pytest.mark.parametrize("model_id", ["timm/resnext101_32x16d", "timm/focalnet_huge_fl4", "timm/regnety_640"])
def test_timm_over_the_limit_is_shrunk_not_excluded(model_id):
    b = M.build(model_id)
    assert b.params <= M.MAX_PARAMS
    assert "blocks_per_stage" in b.note
