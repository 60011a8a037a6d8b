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


def test_per_layer_head_counts_shrink_with_the_heads():
    full = AutoConfig.for_model("sapiens2").to_dict()
    d = M._shrink_dict(dict(full))
    ratio = full["num_attention_heads"] // d["num_attention_heads"]
    kv = d["num_key_value_heads_per_layer"]
    assert kv and all(0 < k <= d["num_attention_heads"] for k in kv)
    # layers keep their grouping: full 16 and 8 of 16 become 4 and 2 of 4
    assert set(kv) <= {x // ratio for x in full["num_key_value_heads_per_layer"]}


def test_mla_per_layer_override_keeps_head_dim_nope_plus_rope():
    text = AutoConfig.for_model("dots3_note").to_dict()["text_config"]
    d = M._shrink_dict(text)
    for o in d["per_layer_config"].values():
        if "qk_nope_head_dim" in o:
            assert d["head_dim"] == o["qk_nope_head_dim"] + d["qk_rope_head_dim"]


def test_multi_layer_neck_keeps_one_backbone_output_per_input():
    d = _shrunk("depth_anything")
    b = d["backbone_config"]
    assert len(b["out_indices"]) == len(d["neck_hidden_sizes"]) == 4
    assert max(b["out_indices"]) <= b["num_hidden_layers"]
    assert b["out_features"] == [f"stage{i}" for i in b["out_indices"]]
    assert len(b["stage_names"]) == b["num_hidden_layers"] + 1


def test_segmentation_out_indices_index_the_kept_layers():
    d = _shrunk("data2vec-vision")  # out_indices [3, 5, 7, 11] of 12 layers
    assert len(d["out_indices"]) == 4
    assert max(d["out_indices"]) <= d["num_hidden_layers"]


def test_kv_sharing_layers_and_per_layer_ffn_widths_follow_the_kept_layers():
    d = _shrunk("gemma3n_text")
    assert d["num_kv_shared_layers"] < d["num_hidden_layers"]
    assert len(d["intermediate_size"]) == d["num_hidden_layers"]
    assert max(d["intermediate_size"]) <= 64


def test_set_fields_sets_nested_sub_config_fields_only():
    d = {"a": 1, "text_config": {"x": None, "y": 2}}
    M._set_fields(d, {"text_config": {"x": [1, 2]}, "b": 3})
    assert d == {"a": 1, "b": 3, "text_config": {"x": [1, 2], "y": 2}}


def test_repair_ties_widths_across_sub_configs_and_feature_layers():
    full = {"hidden_size": 1024, "adapter_in_dim": 1024, "codebook_dim": 1024, "vocab_size": 1024,
            "sub_config": {"model_type": "x", "hidden_size": 512, "num_hidden_layers": 24,
                           "vision_feature_layer": [-1, 23, 18]},
            "proj_config": {"model_type": "y", "text_hidden_size": 512, "intermediate_size": 4096}}
    shrunk = M._shrink_dict(__import__("copy").deepcopy(full))
    assert shrunk["adapter_in_dim"] == 1024  # the plain shrinker leaves untied fields alone
    r = M._tie_widths(full, shrunk)
    assert r["adapter_in_dim"] == r["codebook_dim"] == r["hidden_size"]
    assert r["proj_config"]["text_hidden_size"] == r["sub_config"]["hidden_size"]
    assert r["vocab_size"] == shrunk["vocab_size"]  # not a width field
    assert r["sub_config"]["vision_feature_layer"] == [-1, 1, 0]  # the deepest stays the deepest
    assert shrunk["adapter_in_dim"] == 1024  # repairs work on a copy


def test_codec_and_vqvae_widths_shrink():
    d = _shrunk("vibevoice_acoustic_tokenizer")
    assert d["num_filters"] * 2 ** len(d["downsampling_ratios"]) <= 256
    vq = _shrunk("emu3")["vq_config"]
    assert vq["base_channels"] * max(vq["channel_multiplier"]) <= 128
    assert vq["base_channels"] % 32 == 0  # GroupNorm(32)


def test_unset_library_defaults_are_filled():
    b = M.build("hf/lfm2_moe/Lfm2MoeModel")
    assert set(b.model.config.layer_types) == {"conv", "full_attention"}


def test_codebook_decoders_get_one_id_row_per_codebook():
    b = M.build("hf/musicgen/MusicgenForCausalLM")
    n = b.model.config.num_codebooks
    x = b.candidates[0][2]
    assert x["input_ids"].shape[0] == M.BATCH * n


def test_forecasters_get_context_plus_lags():
    b = M.build("hf/time_series_transformer/TimeSeriesTransformerModel")
    cfg = b.model.config
    x = b.candidates[0][2]
    assert x["past_values"].shape[1] == cfg.context_length + max(cfg.lags_sequence)
    assert x["future_values"].shape[1] == cfg.prediction_length


def test_timm_variant_for_patch_sizes_that_do_not_divide_the_image():
    b = M.build("timm/deepseek_vit_412m", 2)
    size = b.candidates[0][1][0].shape[-1]
    assert size % 14 == 0
    with pytest.raises(M.SameAsBefore):
        M.build("timm/vit_tiny_patch16_224", 2)  # patch 16 divides 64: same as variant 0


def test_exclusion_reason_names_the_models_own_inputs_not_last_resorts(monkeypatch):
    import torch
    from torchtpu._validate import runner

    class Fails(torch.nn.Module):
        def forward(self, x):
            raise ValueError(f"rank {x.dim()}")
    built = M.Built(Fails(), [("kw", (torch.zeros(2),), {}), ("last", (torch.zeros(2, 2),), {})])
    monkeypatch.setattr(M, "build", lambda model_id, variant=0: built)
    monkeypatch.setattr(M, "variants", lambda model_id: 1)
    r = runner._run_model("hf/x/Y", (), False)
    assert r["status"] == "excluded"
    assert r["reason"] == "CPU reference failed: ValueError: rank 1"
