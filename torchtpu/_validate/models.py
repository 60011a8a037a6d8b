"""Enumerates real model architectures and builds tiny random-weight instances with inputs.

Model ids: `hf/<model_type>/<ClassName>`, `timm/<name>`, `tv/<module>/<name>`.
Nothing is downloaded: configs are built from their defaults and shrunk, weights are
random (`from_config`, `pretrained=False`, `weights=None, weights_backbone=None`).

`build(model_id)` returns a `Built`: the model (CPU, eval mode) and a list of candidate
input sets; the runner uses the first candidate whose CPU forward works."""
from __future__ import annotations

import contextlib
import copy
import inspect
import os
import re
from dataclasses import dataclass, field

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

BATCH, SEQ, IMG = 2, 16, 64
# larger (after shrinking) is excluded: too slow for a CPU reference. At 64x64 inputs a
# 140M-parameter VGG-19-BN runs its CPU reference and both tpu modes in about 6 s.
MAX_PARAMS = 150_000_000


class Excluded(Exception):
    """The model cannot be validated (not a tpu failure): reason in the message."""


@dataclass
class Built:
    model: torch.nn.Module
    candidates: list = field(default_factory=list)   # [(kind, args tuple, kwargs dict)]; kind "last": a
    # generic last resort (image pairs, video clips), not named as the reason when all fail
    params: int = 0
    note: str = ""


# ----------------------------------------------------------------------------- enumeration

def _hf_ids():
    """One id per task-head class, under the model type whose name the class carries
    (LlamaForCausalLM is listed under several model types; it belongs to llama)."""
    try:
        from transformers.models.auto import modeling_auto as ma
    except Exception:
        return []
    best = {}
    for name in sorted(n for n in dir(ma) if n.startswith("MODEL") and n.endswith("_MAPPING_NAMES")):
        mapping = getattr(ma, name)
        if not isinstance(mapping, dict):
            continue
        for mt, cls in mapping.items():
            for c in (cls if isinstance(cls, (list, tuple)) else [cls]):
                if not isinstance(c, str):
                    continue
                key = mt.replace("_", "").replace("-", "").lower()
                score = (c.lower().startswith(key), len(key) if c.lower().startswith(key) else 0)
                if c not in best or score > best[c][0]:
                    best[c] = (score, mt)
    return sorted(f"hf/{mt}/{c}" for c, (_, mt) in best.items())


def _timm_ids():
    try:
        import timm
    except Exception:
        return []
    return [f"timm/{n}" for n in sorted(timm.list_models())]


TV_MODULES = ("classification", "segmentation", "detection", "video", "optical_flow")


def _tv_ids():
    import torchvision.models as tvm
    mods = {"classification": tvm, "segmentation": tvm.segmentation,
            "detection": tvm.detection, "video": tvm.video, "optical_flow": tvm.optical_flow}
    ids = []
    for kind in TV_MODULES:
        ids += [f"tv/{kind}/{n}" for n in sorted(tvm.list_models(module=mods[kind]))]
    return ids


def enumerate_models(sources=("hf", "timm", "tv")):
    out = []
    if "hf" in sources:
        out += _hf_ids()
    if "timm" in sources:
        out += _timm_ids()
    if "tv" in sources:
        out += _tv_ids()
    return out


def source_of(model_id):
    return {"hf": "transformers", "timm": "timm", "tv": "torchvision"}[model_id.split("/", 1)[0]]


# ----------------------------------------------------------------------------- config shrinker

_LAYERS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers",
           "decoder_layers", "num_encoder_layers", "num_decoder_layers", "text_layers",
           "vision_layers", "num_text_layers", "num_vision_layers", "depth",
           "num_hidden_groups")
_HIDDEN = ("hidden_size", "d_model", "n_embd", "dim", "embed_dim", "hidden_dim",
           "projection_dim", "word_embed_proj_dim", "embedding_size", "d_embed",
           "encoder_hidden_size", "decoder_hidden_size", "text_embed_dim", "vision_embed_dim",
           "projection_size", "proj_dim", "n_embed", "model_dim", "emb_dim", "d_latents", "embedding_dim", "hidden_size_global",
           # sub-config widths that must equal the text model's hidden size
           "out_hidden_size", "text_hidden_size", "audio_hidden_size")
_HEADS = ("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads",
          "decoder_attention_heads", "n_heads", "num_attention_heads_per_layer")
_FFN = ("intermediate_size", "ffn_dim", "n_inner", "encoder_ffn_dim", "decoder_ffn_dim",
        "d_ff", "moe_intermediate_size", "shared_expert_intermediate_size", "d_inner",
        "decoder_intermediate_size", "encoder_intermediate_size", "ff_dim", "mlp_dim",
        "dense_intermediate_size", "expert_ffn_hidden_size")
_POS = ("max_position_embeddings", "n_positions", "max_target_positions", "n_ctx",
        "max_length", "max_seq_len", "max_sequence_length", "seq_length", "block_size")
_EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_TOPK = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "top_k", "num_selected_experts", "moe_k")
_VOCAB = 1000


# fields that may be tied to a model width (an adapter's input dim, a projector's channels)
_TIE_NAME = re.compile(r"(_dim|_dims|hidden_size|_channels|_width|_input_size)$")
_TIE_SKIP = ("head_dim", "vocab", "image", "patch", "position", "window", "length", "codebook_size", "rank",
             "intermediate", "ffn", "num_", "kernel", "stride", "mel", "sampling", "frame")


def _tie_widths(orig, new):
    """Repairs for a shrunk config that the model rejects (a copy of `new`; `orig` is the
    config before shrinking). Only tried (build variants 6, 7) when the plain shrunk
    configs fail: the width match is by value, so it may also change untied fields.
    - a field holding the original width of a shrunk hidden size, in this or any other
      sub-config (an adapter's `adapter_in_dim`, a talker's `thinker_hidden_size`), takes the
      shrunk width where the generic rules left it unchanged;
    - vision feature layers out of the kept layers' range index them (the deepest stays
      the deepest)."""
    widths = {}

    def pairs(a, b):
        for k, v in a.items():
            if k in b:
                if isinstance(v, dict) and isinstance(b[k], dict):
                    yield from pairs(v, b[k])
                else:
                    yield a, b, k
    new = copy.deepcopy(new)
    for a, b, k in pairs(orig, new):
        v = a[k]
        if k in _HIDDEN and isinstance(v, int) and not isinstance(v, bool) and b[k] != v:
            widths.setdefault(v, b[k])
    for a, b, k in pairs(orig, new):
        v = a[k]
        if isinstance(v, int) and not isinstance(v, bool) and v > 64 and v in widths and b[k] == v \
                and isinstance(k, str) and _TIE_NAME.search(k) and not any(x in k for x in _TIE_SKIP):
            b[k] = widths[v]
    for a, b, k in pairs(orig, new):
        # vision feature layers index the kept layers: the deepest stays the deepest
        v = a[k]
        if isinstance(k, str) and "feature_layer" in k and b[k] == v:
            vs = v if isinstance(v, list) else [v]
            if vs and all(isinstance(x, int) and not isinstance(x, bool) for x in vs) and max(vs) >= 2:
                order = sorted(set(vs), reverse=True)
                vs = [max(0, 1 - order.index(x)) if x >= 0 else max(x, -2) for x in vs]
                b[k] = vs if isinstance(v, list) else vs[0]
    return new


def _shrink_dict(d, keep_images=False, layers_only=False, cover_types=True):
    """Shrinks one config dict in place (recursing into sub-configs). keep_images: leave
    image sizes, patch sizes and positions as they are (for models whose windows or
    position tables assume them). layers_only: shrink only layer, vocab and expert counts
    (for models whose widths are tied by constraints the generic rules break)."""
    old_layers = {}
    orig = dict(d)
    for k, v in list(d.items()):
        if isinstance(v, dict) and (k.endswith("_config") or "model_type" in v):
            _shrink_dict(v, keep_images, layers_only, cover_types)
            continue
        if isinstance(v, bool) or v is None:
            continue
        if isinstance(v, int) and layers_only:
            if k in _LAYERS and v > 2 and not (k == "num_layers" and "depths" in d):
                old_layers[k] = v
                d[k] = 2
            elif k in _EXPERTS and v > 4:
                d[k] = 4
            elif k in _TOPK and v > 2:
                d[k] = 2
        elif isinstance(v, int):
            if k in _LAYERS and v > 2 and not (k == "num_layers" and "depths" in d):
                old_layers[k] = v
                d[k] = 2
            elif k in _HIDDEN and v > 64:
                d[k] = 64
            elif k in _HEADS and v > 4:
                d[k] = 4
            elif k in ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num",
                       "num_key_value_attention_heads") and v > 2:
                # as many key/value heads as query heads stays so (MLA, MHA); grouped gets 2
                d[k] = 4 if v == max(((orig.get(h) or 0) for h in _HEADS if isinstance(orig.get(h), int)), default=0) else 2
            elif (k == "head_dim" or k.endswith("_head_dim") or k == "kv_channels" or k == "attention_head_size" or k == "dim_head") and v > 16:
                d[k] = 16
            elif k in ("rotary_dim", "rotary_emb_dim") and v > 8:
                d[k] = 8  # a part of head_dim (16 after shrinking)
            elif k.endswith("lora_rank") and v > 16:
                d[k] = 16
            elif k in _FFN and v > 64:
                d[k] = 64
            elif k in _POS and v > 128 and not keep_images:
                d[k] = 128
            elif k == "max_source_positions" and v > 64:
                d[k] = 64
            elif k in _EXPERTS and v > 4:
                d[k] = 4
            elif k in _TOPK and v > 2:
                d[k] = 2
            elif k in ("image_size", "img_size", "input_size") and v > IMG and not keep_images:
                d[k] = IMG
            elif k == "num_labels":
                d[k] = 2
            elif k in ("codebook_size", "num_codebooks_vocab") and v > _VOCAB:
                d[k] = 512 if v & (v - 1) == 0 else _VOCAB  # some require a power of 2
            elif k == "upsample_initial_channel" and v > 64:
                d[k] = 64
            elif k == "base_channels" and v > 64 and isinstance(orig.get("channel_multiplier"), list):
                d[k] = 32  # VQ-VAE widths: base times each stage's multiplier (Emu3: 256 -> 1024); GroupNorm(32)
            elif k == "num_filters" and v > 8 and len(orig.get("downsampling_ratios") or ()) > 4:
                d[k] = 4  # doubled at each of many downsampling stages (VibeVoice: 32 -> 2048)
        elif layers_only:
            continue
        elif isinstance(v, (list, tuple)) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            if k in ("hidden_sizes", "embed_dims", "conv_dim", "hidden_dims", "channels", "dims",
                     "encoder_hidden_sizes", "neck_hidden_sizes", "embed_dim"):
                d[k] = [min(x, 16 * 2 ** min(i, 2)) for i, x in enumerate(v)]
                if k == "conv_dim":
                    d[k] = [min(x, 32) for x in v]
            elif k in _FFN and max(v) > 64:  # per-layer FFN widths (Gemma 3n)
                d[k] = [min(x, 64) for x in v]
            elif k in ("depths", "num_layers", "layers", "encoder_layers", "block_repeats") and max(v) > 1:
                d[k] = [1] * len(v)
            elif k in ("num_heads", "num_attention_heads", "heads", "encoder_attention_heads") and max(v) > 2:
                d[k] = [min(x, 2) for x in v]
            elif k in ("image_size", "img_size") and max(v) > IMG and not keep_images:
                d[k] = [IMG] * len(v)
    nh0, nh1 = orig.get("num_attention_heads"), d.get("num_attention_heads")
    if isinstance(nh0, int) and isinstance(nh1, int) and not layers_only and 0 < nh1 < nh0:
        # per-layer head counts (key/value heads per layer) shrink with the heads
        for k, v in list(d.items()):
            if "heads" in k and k not in ("num_heads", "num_attention_heads", "heads", "encoder_attention_heads") \
                    and isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
                d[k] = [max(1, x * nh1 // nh0) for x in v]
    if isinstance(d.get("qk_nope_head_dim"), int) and isinstance(d.get("qk_rope_head_dim"), int):
        # MLA: head dims that were nope + rope stay so
        was = orig["qk_nope_head_dim"] + orig["qk_rope_head_dim"]
        for k in [k for k in d if k.endswith("head_dim") and not k.startswith(("qk_nope", "qk_rope", "v_"))]:
            if k == "qk_head_dim" or orig.get(k) == was:
                d[k] = d["qk_nope_head_dim"] + d["qk_rope_head_dim"]
    for k in ("n_group", "topk_group"):
        if isinstance(d.get(k), int) and d[k] > 1:
            d[k] = 1
    for k in ("rope_scaling", "rope_parameters"):
        rp = d.get(k)
        if isinstance(rp, dict) and isinstance(rp.get("mrope_section"), list) and len(rp["mrope_section"]) == 3:
            rp["mrope_section"] = [2, 3, 3]  # sums to head_dim / 2 = 8
    if old_layers and "stage_names" in d:  # backbones: stages follow the new layer count
        oi = orig.get("out_indices")
        n = len(oi) if isinstance(oi, (list, tuple)) else 0
        lk = next((k for k in ("num_hidden_layers", "num_layers", "depth") if k in old_layers), None)
        if n > 1 and lk and orig.get("stage_names") == ["stem"] + [f"stage{i}" for i in range(1, old_layers[lk] + 1)]:
            # a neck that takes several layers' outputs (DPT): as many layers, each an output
            d[lk] = max(d[lk], n)
            d["stage_names"] = ["stem"] + [f"stage{i}" for i in range(1, d[lk] + 1)]
            d["out_indices"] = list(range(d[lk] - n + 1, d[lk] + 1))
            d["out_features"] = [f"stage{i}" for i in d["out_indices"]]
        else:
            for k in ("stage_names", "out_features", "out_indices"):
                d.pop(k, None)
    elif old_layers and "num_hidden_layers" in old_layers and isinstance(orig.get("out_indices"), list) \
            and len(orig["out_indices"]) > 1 and all(isinstance(x, int) for x in orig["out_indices"]) \
            and max(orig["out_indices"]) >= d["num_hidden_layers"]:
        # layer indices a segmentation head reads (BEiT-style, no stage names): the last layers
        n = len(orig["out_indices"])
        d["num_hidden_layers"] = max(d["num_hidden_layers"], n)
        d["out_indices"] = list(range(d["num_hidden_layers"] - n + 1, d["num_hidden_layers"] + 1))
    # vocab sizes and the token ids that must stay inside them
    for k, v in list(d.items()):
        if isinstance(v, int) and not isinstance(v, bool) and ("vocab_size" in k or k.endswith("group_vocab")) and v > _VOCAB:
            d[k] = _VOCAB
    big = {}
    for k, v in list(d.items()):
        if (k.endswith("token_id") or k.endswith("token_index") or k.endswith("_token_ids")) and isinstance(v, int) \
                and not isinstance(v, bool) and v >= _VOCAB - 10:
            d[k] = big.setdefault(v, _VOCAB - 1 - len(big))
        elif k.endswith("token_id") and isinstance(v, list):
            d[k] = [big.setdefault(x, _VOCAB - 1 - len(big)) if isinstance(x, int) and x >= _VOCAB - 10 else x
                    for x in v]
    for k, v in list(d.items()):
        # layers that reuse an earlier layer's key/value cache (Gemma 3n's last 15 of 35):
        # none of the kept ones, or no layer would produce the cache they read
        if k.endswith("shared_layers") and isinstance(v, int) and not isinstance(v, bool) and v > 0 \
                and old_layers and v >= min(old_layers.values()) // 4:
            d[k] = 0
    # per-layer lists sized by the old layer count: the kept layers cover every layer type
    for old in set(old_layers.values()):
        keep = _layers_to_keep(d, old) if cover_types else [0, 1]
        if len(keep) > 2:
            for k, n in old_layers.items():
                if n == old:
                    d[k] = len(keep)
        for k, v in list(d.items()):
            if isinstance(v, list) and len(v) == old:
                d[k] = [v[i] for i in keep]
        plc = d.get("per_layer_config")
        if isinstance(plc, dict):  # {layer index: overrides}
            d["per_layer_config"] = {new: _shrink_dict(dict(plc[o]), keep_images, layers_only, cover_types)
                                     for new, i in enumerate(keep) for o in plc if int(o) == i}
            for o in d["per_layer_config"].values():
                # MLA layers whose own nope dim plus the shared rope dim was the head dim
                was = {plc[k].get("qk_nope_head_dim") for k in plc}
                if isinstance(o.get("qk_nope_head_dim"), int) and isinstance(d.get("head_dim"), int) \
                        and isinstance(orig.get("qk_rope_head_dim"), int) \
                        and any(isinstance(n, int) and n + orig["qk_rope_head_dim"] == orig.get("head_dim") for n in was):
                    d["head_dim"] = o["qk_nope_head_dim"] + d["qk_rope_head_dim"]
    if not layers_only:
        # Mamba heads: hidden_size * expand == heads * head_dim
        for nh, hd, ex in (("num_heads", "head_dim", "expand"), ("mamba_n_heads", "mamba_d_head", "mamba_expand")):
            vals = [d.get(x) for x in (nh, hd, ex, "hidden_size")]
            if all(isinstance(x, int) and not isinstance(x, bool) for x in vals) and \
                    any(k in d for k in ("state_size", "ssm_state_size", "mamba_d_state")):
                d[hd] = vals[3] * vals[2] // vals[0]
                if isinstance(d.get("mamba_d_ssm"), int):  # Falcon-H1: an explicit inner width
                    d["mamba_d_ssm"] = vals[3] * vals[2]
                if isinstance(d.get("n_groups"), int) and d["n_groups"] > 1:
                    d["n_groups"] = 1  # heads are split into groups
    if "vocab_size" in d and d["vocab_size"] is None and ("pad_token_id" in d or "mask_token_id" in d):
        d["vocab_size"] = _VOCAB  # token heads need one (ESM, CTC heads default to None)
    if "num_key_value_heads" in d and d["num_key_value_heads"] is None and isinstance(d.get("num_attention_heads"), int):
        d["num_key_value_heads"] = d["num_attention_heads"]  # code that divides by it unguarded
    if "head_dim" in d and d["head_dim"] is None and isinstance(d.get("hidden_size"), int) \
            and isinstance(d.get("num_attention_heads"), int) and d["num_attention_heads"]:
        d["head_dim"] = d["hidden_size"] // d["num_attention_heads"]  # code that reads it unguarded
    if isinstance(d.get("num_queries"), int) and d["num_queries"] > 100:
        d["num_queries"] = 32  # top-k over the encoder tokens of a 64x64 image
    oi = d.get("backbone_out_indices")
    if old_layers and isinstance(oi, list) and oi and all(isinstance(x, int) for x in oi):
        for k in old_layers:  # one layer per output the neck expects
            d[k] = max(2, len(oi))
        d["backbone_out_indices"] = list(range(len(oi)))
    if d.get("num_experts_per_tok", 0) is None and any(isinstance(d.get(k), int) for k in _EXPERTS):
        d["num_experts_per_tok"] = 2  # experts built but no routing width by default
    if d.get("default_language") is None and isinstance(d.get("languages"), list) and d["languages"]:
        d["default_language"] = d["languages"][0]  # X-MOD needs one adapter language
    h0, h1 = orig.get("hidden_size"), d.get("hidden_size")
    if isinstance(h0, int) and isinstance(h1, int) and h1 < h0 and not layers_only:
        for k, v in list(d.items()):  # depthwise convolutions over the hidden width (Mimi's upsampler)
            if k.endswith("_groups") and v == h0:
                d[k] = h1
    if "use_cache" in d:
        d["use_cache"] = False
    if "pad_token_id" in d and d["pad_token_id"] is None:
        d["pad_token_id"] = 0  # sequence-classification heads need one for batch > 1
    return d


def _layers_to_keep(d, old):
    """Indices of the layers kept when `old` layers become 2: the first two, or the first
    layer of each distinct type in a per-layer string list (layer_types), so that a model
    needing a full-attention or a mamba layer still has one."""
    keep = [0, 1]
    for k, v in d.items():
        if isinstance(v, list) and len(v) == old and v and all(isinstance(x, str) for x in v):
            first = {}
            for i, x in enumerate(v):
                first.setdefault(x, i)
            if len(first) > 1:
                keep = sorted(set(keep[:1]) | set(first.values()))[:4]
                if len(keep) < 2:
                    keep = [0, 1]
    return keep


def _modeling_source(model_type):
    import importlib
    from transformers.models.auto.configuration_auto import model_type_to_module_name
    name = model_type_to_module_name(model_type)
    try:
        return inspect.getsource(importlib.import_module(f"transformers.models.{name}.modeling_{name}"))
    except Exception:
        return ""


def _mrope(d, modeling_src):
    """Multimodal rope sections (t, h, w) must sum to half the rotary dim; models whose
    code has a default section for the full-size head dim get one for the shrunk one.
    A sub-config is checked against its own model type's code."""
    if isinstance(d.get("model_type"), str):
        modeling_src = modeling_src + _modeling_source(d["model_type"])
    for v in d.values():
        if isinstance(v, dict):
            _mrope(v, modeling_src)
    rp = d.get("rope_parameters")
    if not isinstance(rp, dict) or "rope_type" not in rp or "mrope_section" in rp \
            or '"mrope_section"' not in modeling_src:
        return
    hd = d.get("head_dim")
    if not isinstance(hd, int):
        h, n = d.get("hidden_size"), d.get("num_attention_heads")
        if not (isinstance(h, int) and isinstance(n, int) and n):
            return
        hd = h // n
    prf = rp.get("partial_rotary_factor", d.get("partial_rotary_factor")) or 1.0
    half = int(hd * prf) // 2
    third = half * 3 // 8
    rp["mrope_section"] = [half - 2 * third, third, third]


def _intraclass_block(long=7, mid=5, short=3):
    """PP-OCR detection necks: (kernel, stride, padding) of each intra-class block conv, the
    7/5/3 vertical, horizontal and square kernels the block's docstring describes, each
    keeping the feature map's size."""
    cfg = {"reduce_channel": [1, 1, 0], "return_channel": [1, 1, 0]}
    for name, k in (("longratio", long), ("midratio", mid), ("shortratio", short)):
        p = (k - 1) // 2
        cfg[f"vertical_long_to_small_conv_{name}"] = [[k, 1], 1, [p, 0]]
        cfg[f"horizontal_small_to_long_conv_{name}"] = [[1, k], 1, [0, p]]
        cfg[f"symmetric_conv_long_{name}"] = [k, 1, p]
    return cfg


# Config fields a model needs but whose library default is None or a placeholder (the
# published checkpoints set them): set in the default config before shrinking. Values are
# small and self-consistent; a nested dict sets fields of a sub-config.
_HF_CONFIG_SET = {
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_hidden_layers": 2},
    "deepseek_ocr2": {"text_config": {"mlp_layer_types": ["dense", "sparse"], "num_hidden_layers": 2}},
    "sapiens2": {"head_config": {"upsample_out_channels": [32, 32], "conv_out_channels": [32],
                                 "scale_conv_out_channels": [32], "scale_final_hidden_sizes": [32, 32]}},
    # the neck fuses every backbone stage (stride 4 to 32), but the default backbone
    # returns only the last
    "pp_ocrv6_medium_det": {"intraclass_block_config": _intraclass_block(), "kernel_list": [3, 2, 2],
                            "scale_factor_list": [1, 2, 4, 8],
                            "backbone_config": lambda: _sub_config_default("pp_ocrv6_medium_det", "backbone_config")},
    # the small one's config names its backbone (PP-LCNetV3 x0.75, stride 4 to 32 stages) as a
    # sub-config default that AutoConfig does not apply; the neck's input widths are its stages'
    "pp_ocrv6_small_det": {"backbone_config": lambda: _sub_config_default("pp_ocrv6_small_det", "backbone_config"),
                           "layer_list_out_channels": [48, 96, 192, 384]},
    "pp_ocrv5_server_det": {"intraclass_block_config": _intraclass_block(), "kernel_list": [3, 2, 2],
                            "scale_factor_list": [1, 2, 4, 8]},  # stride 4, 8, 16, 32 features to stride 4
    "perception_lm": {"vision_config": {"architecture": "vit_pe_core_tiny_patch16_384",
                                        "model_args": {"embed_dim": 64, "depth": 2, "num_heads": 4,
                                                       "img_size": IMG}}},
    "timm_backbone": {"backbone": "resnet18"},
    # UVDoc concatenates all six bridge stages; the default backbone returns only the last
    "uvdoc": {"backbone_config": {"out_features": [f"stage{i}" for i in range(1, 7)], "out_indices": list(range(1, 7))}},
    # LW-DETR's default has no projector level (the checkpoints have one, at scale 1): the
    # four ViT stage outputs, concatenated, projected once
    "lw_detr": {"projector_scale_factors": [1.0], "num_feature_levels": 1, "projector_in_channels": [256]},
    # the four layers the semantic segmentation head reads (the base-size default)
    "beit": {"out_indices": [3, 5, 7, 11], "out_features": ["stage3", "stage5", "stage7", "stage11"]},
    # attributes the modeling code reads from a (sub-)config that does not define them
    "dbrx": {"attn_config": {"rope_theta": 500000.0, "clip_qkv": 8.0}},
    "t5gemma2_encoder": {"text_config": {"dropout_rate": 0.0}},
    "moonshine_streaming": {"num_key_value_heads": 8},
    # the default names the RepViT backbone under a misspelt key ("archirecture"), so the
    # wrapper builds its placeholder ResNet-50, whose widths the FPN does not take
    "edgetam": {"vision_config": {"backbone_config": {"architecture": "repvit_m1"}}},
    "edgetam_vision_model": {"backbone_config": {"architecture": "repvit_m1"}},
    # MoE and decoder sizes the default config leaves None
    "dots1": {"n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2},
    "diffusion_gemma": {"text_config": {"num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 64}},
    "hiera": {"decoder_hidden_size": 64, "decoder_depth": 1, "decoder_num_heads": 2},
    # the tokenizer's vocabulary map: just the image placeholder (the last id of the shrunk vocabulary)
    "chameleon": {"vocabulary_map": {"<image>": _VOCAB - 1}},
    "emu3": {"vocabulary_map": {"<image>": _VOCAB - 1}},
    # the placeholder token the Q-Former outputs replace (the last id of the shrunk vocabulary)
    "blip-2": {"image_token_index": _VOCAB - 1},
    "instructblip": {"image_token_index": _VOCAB - 1},
    "instructblipvideo": {"video_token_index": _VOCAB - 1},
    # forecasters whose windows have no default
    "autoformer": {"prediction_length": 8, "context_length": 16},
    "informer": {"prediction_length": 8, "context_length": 16},
    "time_series_transformer": {"prediction_length": 8, "context_length": 16},
    # per-layer-type rope (the default leaves it empty: a NoPE-capable layout)
    "cohere_compass": {"text_config": {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}}},
    "cohere_compass_text": {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
}

# Fields set after shrinking, where the generic rules cannot know a model's layout.
_HF_SHRUNK_SET = {
    # Dory serializes each decoder layer as an attention block and an mlp block (counts
    # doubled): one input, one recurrent and one output layer
    "dory": {"num_hidden_layers": 6, "n_input_layers": 2, "n_recurrent_layers": 2, "n_output_layers": 2,
             "layer_types": ["sliding_attention", "mlp", "full_attention", "mlp", "sliding_attention", "mlp"]},
    # the patches of the multi-scale image are the ViT's images (shrunk to IMG); the input
    # is then 4 of them wide (its smallest scale, 0.25, one patch)
    "depth_pro": {"patch_size": IMG, "intermediate_hook_ids": [1, 0]},  # hooks: layers 11, 5 of 12 -> 1, 0 of 2
    # TVP's visual prompt pads frames to max_img_size: the shrunk image size, 4 frames
    # (the clips of the generic video inputs)
    "tvp": {"max_img_size": IMG, "visual_prompt_size": 16, "num_frames": 4},
    # pixel decoder widths equal to the (shrunk) transformer width, as in the default: where
    # they differ OneFormer projects through convolutions held in a plain list, which
    # Module.to() does not move (a transformers bug; the published configs never hit it)
    "oneformer": {"conv_dim": 64, "mask_dim": 64},
    "videomae": {"decoder_num_attention_heads": 4},
    # CLAP's audio Swin doubles its patch width at each stage: 2 stages of 32 end at the
    # shrunk hidden size (96 x 8 = 768 in the default)
    "clap": {"audio_config": {"patch_embeds_hidden_size": 32}},
    # Llama 4's vision adapter: a pixel shuffle (ratio 0.5) makes 4x the width, which its MLP
    # takes as intermediate_size (5632 = 4 x 1408 in the checkpoints)
    "llama4": {"vision_config": {"intermediate_size": 256, "projector_input_dim": 64, "projector_output_dim": 64,
                                 "vision_output_dim": 64}},
    # vision layers whose features are injected at LLM layers (the default has none; the
    # checkpoints map deep layers): the 2 kept of each, and the 4 spatial groups' LLM layers
    "granite4_vision": {"deepstack_layer_map": [[0, 0], [1, 1]], "spatial_target_layers": [0, 0, 1, 1],
                        "downsample_rate": "1/2"},  # and a Q-Former window rate (none by default)
    # the encoder reads the HGNetV2 stages' widths from hidden_sizes, which that backbone
    # does not use (its stage_out_channels, not shrunk, make the widths); a score threshold
    # and a reading priority per label (the checkpoints' lists; the default has none)
    "pp_doclayout_v2": {"backbone_config": {"hidden_sizes": [256, 512, 1024, 2048]},
                        "class_thresholds": [0.5, 0.5], "class_order": [0, 1]},
    # RF-DETR picks its queries by top-k over the encoder tokens: 16 at 64x64 (patch 14)
    "rf_detr": {"num_queries": 8},
    "lw_detr": {"num_queries": 8},  # the same, patch 16  # the pre-training decoder's 6 heads of 384 -> 4 of 64
    # the last num_blocks encoder layers also see the queries: 1 of the 2 kept
    "eomt": {"num_blocks": 1},
    "eomt_dinov3": {"num_blocks": 1},
    # text tokens, then the image codebook's, then the audio codebook's (512 each after shrinking)
    "apertus1p5": {"image_token_offset": 200, "audio_token_offset": 712, "text_config": {"vocab_size": 1280}},
}

# Fields one task-head class needs (set after shrinking, for that class only).
_HF_CLASS_SET = {
    "ReformerModelWithLMHead": {"is_decoder": True},   # its constructor requires a decoder
    "T5GemmaEncoderModel": {"is_encoder_decoder": False},
    # the intermediate layers whose outputs join the last one's: the 2 kept of 32
    "MllamaVisionModel": {"vision_config": {"intermediate_layers_indices": [0, 1], "vision_output_dim": 3 * 64}},
    "T5ForSequenceClassification": {"decoder_start_token_id": 0},  # decoder ids from input_ids
    # cross-attention over preprocessed pixels whose width (261, 322) no head count > 1 divides
    "PerceiverForImageClassificationFourier": {"num_cross_attention_heads": 1},
    "PerceiverForImageClassificationConvProcessing": {"num_cross_attention_heads": 1},
}


def _sub_config_default(model_type, name):
    """The sub-config a config class declares as its default (sub_configs_defaults) as a
    dict, for configs whose constructor falls back to another default."""
    from transformers import AutoConfig
    spec = type(AutoConfig.for_model(model_type)).sub_configs_defaults[name]
    return AutoConfig.for_model(spec.model_type, **spec.init_kwargs).to_dict()


def _set_fields(d, fields):
    """Sets each field of `fields` in the config dict d; a dict value for a sub-config that
    d has as a dict sets fields inside it; a callable value is called for the value."""
    for k, v in fields.items():
        if callable(v):
            v = v()
        if isinstance(v, dict) and isinstance(d.get(k), dict):
            _set_fields(d[k], v)
        else:
            d[k] = copy.deepcopy(v)
    return d


class SameAsBefore(Excluded):
    """This build variant would build the same model as the one before it."""


def _hf_build(model_type, cls_name, variant=0):
    """Variants 0-5: even ones keep one layer of each layer type, odd ones the first two
    layers (for a layer type whose defaults are incomplete), only where that differs.
    Variants 6, 7: variants 0 and 2 with the repairs of _tie_widths, only where they
    change the config."""
    if variant >= 6:
        shrink, cover, repair = variant - 6, True, True
    else:
        shrink, cover, repair = variant // 2, variant % 2 == 0, False
    if not cover or repair:
        from transformers import AutoConfig
        try:
            d = _set_fields(AutoConfig.for_model(model_type).to_dict(), _HF_CONFIG_SET.get(model_type, {}))
        except Exception:
            d = {}
        kw = dict(keep_images=shrink >= 1, layers_only=shrink == 2)
        if repair:
            s = _shrink_dict(copy.deepcopy(d), **kw)
            if _tie_widths(d, s) == s:
                raise SameAsBefore("no repair applies")
        elif _shrink_dict(copy.deepcopy(d), cover_types=True, **kw) == _shrink_dict(copy.deepcopy(d), cover_types=False, **kw):
            raise SameAsBefore("same as the previous variant")
    return _hf_build_once(model_type, cls_name, shrink, cover, repair)


def _hf_build_once(model_type, cls_name, variant, cover_types, repair=False):
    import transformers
    from transformers import AutoConfig
    cls = getattr(transformers, cls_name, None)
    if cls is None:
        raise Excluded(f"class {cls_name} is not exported by transformers")
    _name_block_mask(cls)
    try:
        cfg0 = AutoConfig.for_model(model_type)
    except Exception as e:
        raise Excluded(f"config for {model_type}: {type(e).__name__}: {e}")
    full = _set_fields(cfg0.to_dict(), _HF_CONFIG_SET.get(model_type, {}))
    d = _shrink_dict(copy.deepcopy(full), keep_images=variant >= 1, layers_only=variant == 2, cover_types=cover_types)
    _set_fields(d, _HF_SHRUNK_SET.get(model_type, {}))
    _set_fields(d, _HF_CLASS_SET.get(cls_name, {}))
    if variant < 2:
        try:
            import sys
            _mrope(d, inspect.getsource(sys.modules[cls.__module__]))
        except (OSError, TypeError, KeyError):
            pass
    for k in ("transformers_version", "architectures", "_name_or_path"):
        d.pop(k, None)
    if repair:
        d = _tie_widths(full, d)
    model, cfg = _hf_construct(cls, cfg0, d)
    model.eval()
    return Built(model, _hf_candidates(model, cfg, cls_name))


def _name_block_mask(cls):
    """Modeling code that imports flex attention's BlockMask only where flex attention is
    available (transformers says it is not with a tpu host device) but names it in an
    isinstance check on every path (Doge) gets the name: the check is then False, as for
    any mask that is not a BlockMask."""
    import sys
    mod = sys.modules.get(cls.__module__)
    if mod is not None and not hasattr(mod, "BlockMask") and "isinstance(attention_mask, BlockMask)" in \
            (inspect.getsource(mod) if getattr(mod, "__file__", None) else ""):
        from torch.nn.attention.flex_attention import BlockMask
        mod.BlockMask = BlockMask


def _hf_construct(cls, cfg0, d):
    """(model, config) of class cls from the shrunk config dict d, or Excluded."""
    try:
        cfg = type(cfg0).from_dict(d)
    except Exception as e:
        raise Excluded(f"tiny config rejected: {type(e).__name__}: {str(e)[:200]}")
    try:
        cfg.use_cache = False
    except Exception:
        pass
    ctx = contextlib.nullcontext()
    try:
        _check_size(lambda: cls._from_config(cfg))
    except Excluded:
        if not _builds_timm(d):
            raise
        # a timm tower (Gemma 3n's MobileNetV5) over the limit: fewer blocks per stage, as
        # for timm's own models (widths kept: the projector after it takes them)
        ctx = _timm_shrinking(widths=0)
        with ctx:
            _check_size(lambda: cls._from_config(cfg))
    torch.manual_seed(0)
    try:
        with ctx:
            model = cls._from_config(cfg)
    except Exception as e:
        # a text or decoder class listed under a composite model type takes its sub-config
        sub = cls.config_class is not type(cfg) and next(
            (s for s in (getattr(cfg, n, None) for n in ("text_config", "decoder", "decoder_config", "language_config",
                                                         "vision_config", "audio_config", "encoder", "encoder_config"))
             if isinstance(s, cls.config_class or ())), None)
        if not sub:
            raise Excluded(f"tiny model construction failed: {type(e).__name__}: {str(e)[:200]}")
        cfg = sub
        _check_size(lambda: cls._from_config(cfg))
        torch.manual_seed(0)
        try:
            model = cls._from_config(cfg)
        except Exception as e:
            raise Excluded(f"tiny model construction failed: {type(e).__name__}: {str(e)[:200]}")
    return model, cfg


def _builds_timm(d):
    """Whether a config (dict) names a timm architecture for a tower."""
    return any(isinstance(v, dict) and _builds_timm(v) for v in d.values()) or \
        isinstance(d.get("architecture"), str)


def _check_size(make):
    """Counts parameters on the meta device; excludes models too large for a CPU reference."""
    try:
        with torch.device("meta"):
            m = make()
        n = sum(p.numel() for p in m.parameters())
    except Exception:
        return
    if n > MAX_PARAMS:
        raise Excluded(f"too large after shrinking ({n / 1e6:.0f}M parameters)")


def _check_built_size(model):
    n = sum(p.numel() for p in model.parameters())
    if n > MAX_PARAMS:
        raise Excluded(f"too large after shrinking ({n / 1e6:.0f}M parameters)")


def _sub(cfg, *names):
    for n in names:
        s = getattr(cfg, n, None)
        if s is not None and hasattr(s, "to_dict"):
            return s
    return None


def _get(cfgs, *names, default=None):
    for c in cfgs:
        if c is None:
            continue
        for n in names:
            v = getattr(c, n, None)
            if v is not None:
                return v
    return default


def _hw(v):
    if isinstance(v, dict):
        return int(v.get("height", IMG)), int(v.get("width", IMG))
    if isinstance(v, (list, tuple)):
        return int(v[0]), int(v[-1])
    return int(v), int(v)


def _hf_candidates(model, cfg, cls_name):
    sig = inspect.signature(model.forward).parameters
    text = _sub(cfg, "text_config", "decoder", "text_encoder", "language_config", "model_config") or cfg
    vis = _sub(cfg, "vision_config", "encoder", "image_encoder", "backbone_config") or cfg
    aud = _sub(cfg, "audio_config", "encoder", "encoder_config", "speech_config") or cfg
    g = torch.Generator().manual_seed(0)
    vocab = _get([text, cfg], "vocab_size", default=_VOCAB)
    if not isinstance(vocab, int):
        vocab = _VOCAB
    vocab = min(vocab, _VOCAB - 20)
    shape = (BATCH, 2, SEQ) if "MultipleChoice" in cls_name else (BATCH, SEQ)

    def ids(shape=shape):
        return torch.randint(3, max(vocab, 4), shape, generator=g)

    h, w = _hw(_get([vis, cfg], "image_size", "img_size", "input_size", default=IMG))
    sr = _get([cfg], "scaled_images_ratios")
    if isinstance(sr, list) and sr and isinstance(_get([cfg], "patch_size"), int):
        h = w = int(cfg.patch_size / min(sr))  # DepthPro: the smallest scale is one patch
    if "prompt_pixel_values" in sig:
        h = max(1, h // 2)  # SegGPT: the prompt image above the input image make the model's image
    ch = _get([vis, cfg], "num_channels", "in_channels", "in_chans", default=3)
    ch = ch if isinstance(ch, int) else 3
    pixels = torch.randn(BATCH, ch, h, w, generator=g)
    main = getattr(model, "main_input_name", "input_ids")
    if isinstance(main, (list, tuple)):  # OneFormer: pixels and task tokens
        main = main[0]
    required = [n for n, p in sig.items() if p.default is inspect.Parameter.empty
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and n != "self"]
    if main == "pixel_values" and main not in sig and "input_ids" in sig and "input_ids" not in required:
        main = "input_ids"  # a text tower that inherits its model's main input name (SAM 3 Lite's)

    eos = _get([text, cfg], "eos_token_id")
    seq_cls_enc_dec = getattr(cfg, "is_encoder_decoder", False) and "ForSequenceClassification" in cls_name

    def text_inputs():
        x = {"input_ids": ids()}
        if seq_cls_enc_dec and isinstance(eos, int) and 0 <= eos < vocab:
            x["input_ids"][:, -1] = eos  # the head pools the last <eos>; decoder ids come from input_ids
        if "attention_mask" in sig:
            x["attention_mask"] = torch.ones_like(x["input_ids"])
        return x

    def add_decoder(x):
        if getattr(cfg, "is_encoder_decoder", False) and "decoder_input_ids" in sig and not seq_cls_enc_dec:
            x["decoder_input_ids"] = ids((BATCH, SEQ // 2))
        return x

    mel_bins = _get([aud, cfg], "num_mel_bins", "feature_size", "input_feat_per_channel", "n_mels", default=80)

    def audio_features():
        mel = _get([aud, cfg], "num_mel_bins", "feature_size", "input_feat_per_channel", "n_mels", default=80)
        src = _get([aud, cfg], "max_source_positions", default=None)
        cands = []
        if src:
            cands.append(torch.randn(BATCH, mel, 2 * src, generator=g))
        cands.append(torch.randn(BATCH, 64, mel, generator=g))
        cands.append(torch.randn(BATCH, mel, 64, generator=g))
        feat = _get([aud, cfg], "feature_size", "feature_projection_input_dim", default=None)
        if isinstance(feat, int) and feat != mel:  # stacked frames (w2v-BERT, SeamlessM4T)
            cands.append(torch.randn(BATCH, 64, feat, generator=g))
        cands.append(torch.randn(BATCH, mel, 200, generator=g))  # whole 100-frame windows (Qwen3-ASR)
        if mel != 128:  # 128 mel bins where the config does not say (Gemma 4 audio's subsampler)
            cands.append(torch.randn(BATCH, 64, 128, generator=g))
        cands.append(torch.randn(BATCH, 64, 4 * mel, generator=g))  # 4 stacked frames (Granite Speech)
        cands.append(torch.randn(BATCH, mel, 8 * SEQ, generator=g))  # one token per 8 frames (Voxtral Realtime)
        nsf = _get([aud, cfg], "num_stacked_frames")
        if isinstance(nsf, int) and nsf not in (1, 4):  # Fun-ASR: 7 stacked frames
            cands.append(torch.randn(BATCH, 64, nsf * mel, generator=g))
        return cands

    cands = []
    if main == "input_ids" or main not in ("pixel_values", "input_values", "input_features"):
        full = text_inputs()
        if "pixel_values" in sig and ("pixel_values" in required or _sub(cfg, "vision_config") is not None):
            full_mm = dict(full, pixel_values=pixels)
            cands.append(("kw", (), add_decoder(full_mm)))
        cands.append(("kw", (), add_decoder(dict(full))))
        if "attention_mask" in full:
            cands.append(("kw", (), add_decoder({"input_ids": full["input_ids"]})))
        if "input_ids" not in sig and main in sig:  # e.g. Perceiver's `inputs`: ids, features or pixels
            width = _get([text, cfg], "d_model", "hidden_size", default=64)
            cands += [("kw", (), {main: x}) for x in (ids(), pixels, torch.randn(BATCH, SEQ, width, generator=g))]
            # a speech encoder-decoder's `inputs`: raw audio, with decoder ids
            cands.append(("kw", (), add_decoder({main: torch.randn(BATCH, 1600, generator=g)})))
            if "video" in main:  # video towers: (batch, frames, channels, height, width)
                nf = _get([vis, cfg], "num_frames", default=4)
                nf = nf if isinstance(nf, int) and 0 < nf <= 16 else 4
                cands += [("kw", (), {main: torch.randn(BATCH, nf, ch, s, s, generator=g)})
                          for s in dict.fromkeys((h, 224, 336))]
    elif main == "pixel_values":
        x = {"pixel_values": pixels}
        frames = _get([vis, cfg], "num_frames", default=None)
        if isinstance(frames, int):  # video models: (batch, frames, channels, height, width)
            x = {"pixel_values": torch.randn(BATCH, frames, ch, h, w, generator=g)}
        if "input_ids" in sig and ("input_ids" in required or _sub(cfg, "text_config") is not None):
            cands.append(("kw", (), add_decoder(dict(x, **text_inputs()))))
        cands.append(("kw", (), add_decoder(x)))
        if getattr(cfg, "is_encoder_decoder", False) or "decoder_input_ids" in sig:
            cands.append(("kw", (), dict(x, decoder_input_ids=ids((BATCH, SEQ // 2)))))
        # keypoint matchers take image pairs: (batch, 2, channels, height, width)
        cands.append(("last", (), {"pixel_values": torch.randn(BATCH, 2, ch, h, w, generator=g)}))
        # text-line recognizers (PP-OCR) pool the height down to one row; with the default
        # backbone's stride 32 in both directions a line needs 96 rows
        cands.append(("last", (), {"pixel_values": torch.randn(BATCH, ch, 96, 320, generator=g)}))
    elif main == "input_values":
        mel = _get([aud, cfg], "num_mel_bins", default=None)
        if isinstance(mel, int):  # spectrogram patches (AST): (batch, frames, mel bins)
            frames = _get([aud, cfg], "max_length", default=128)
            cands.append(("kw", (), {"input_values": torch.randn(BATCH, frames, mel, generator=g)}))
        for n in (1600, 4000, 16000, 9600):  # 9600: whole 96-sample frames (MuseSpark)
            cands.append(("kw", (), add_decoder({"input_values": torch.randn(BATCH, n, generator=g)})))
        cands.append(("kw", (), add_decoder({"input_values": torch.randn(BATCH, 1, 4000, generator=g)})))
    elif main == "input_features":
        for f in audio_features():
            x = add_decoder({"input_features": f})
            if "input_ids" in sig and "input_ids" in required:
                x.update(text_inputs())
            cands.append(("kw", (), x))

    # last resorts, tried only when every input set above fails on CPU
    if main == "input_ids" and cands:
        base = cands[-1][2]
        if "pixel_values" in sig and "pixel_values" not in base:  # ViLT: text and image, no vision sub-config
            cands.append(("kw", (), dict(base, pixel_values=pixels)))
        if "visual_feats" in sig and isinstance(getattr(cfg, "visual_feat_dim", None), int):  # LXMERT: region features
            cands.append(("kw", (), dict(base, visual_feats=torch.randn(BATCH, 8, cfg.visual_feat_dim, generator=g),
                                         visual_pos=torch.rand(BATCH, 8, 4, generator=g))))
        sep = _get([cfg], "sep_token_id", "eos_token_id")
        if ("QuestionAnswering" in cls_name or "MultipleChoice" in cls_name) and isinstance(sep, int) and 0 <= sep < vocab:
            qa = base["input_ids"].clone()  # question </s></s> context </s>
            qa[..., [SEQ // 4, SEQ // 4 + 1, SEQ - 1]] = sep
            cands.append(("kw", (), dict(base, input_ids=qa)))
        q = _get([cfg], "question_token_id")
        if isinstance(q, int) and 0 <= q < vocab:  # Splinter: a question token in every sample
            qa = base["input_ids"].clone()
            qa[..., SEQ // 4] = q
            cands.append(("kw", (), dict(base, input_ids=qa)))
        if "decoder_input_ids" in sig and "decoder_input_ids" not in base:  # BLIP VQA: a decoder without enc-dec config
            cands.append(("kw", (), dict(base, pixel_values=pixels, decoder_input_ids=ids((BATCH, SEQ // 2)))
                          if "pixel_values" in sig else dict(base, decoder_input_ids=ids((BATCH, SEQ // 2)))))

    if "past_values" in sig and isinstance(getattr(cfg, "num_input_channels", None), int):
        # multichannel time series (PatchTST, PatchTSMixer): (batch, context, channels)
        n = _get([cfg], "context_length", default=32)
        c = cfg.num_input_channels
        cands.insert(0, ("kw", (), {"past_values": torch.randn(BATCH, n, c, generator=g)}))

    if "spatial_shapes" in sig and str(getattr(cfg, "model_type", "")).startswith("siglip2") \
            and isinstance(_get([vis], "patch_size"), int):
        # NaFlex towers (SigLIP 2): flattened patches of a (rows, cols) grid, none padded
        p = _get([vis], "patch_size")
        r, c = max(1, h // p), max(1, w // p)
        x = {"pixel_values": torch.randn(BATCH, r * c, ch * p * p, generator=g),
             "pixel_attention_mask": torch.ones(BATCH, r * c, dtype=torch.long),
             "spatial_shapes": torch.tensor([[r, c]] * BATCH)}
        if "input_ids" in sig:
            x.update(text_inputs())
        cands.insert(0, ("kw", (), x))

    if "pixel_position_ids" in required and isinstance(_get([vis], "patch_size"), int):
        # Gemma 4 vision: flattened patches of a (rows, cols) grid and their (x, y)
        # positions, none padded; the grid is whole pooling windows
        p, k = _get([vis], "patch_size"), _get([vis], "pooling_kernel_size", default=1)
        r = c = 2 * k
        pos = torch.stack(torch.meshgrid(torch.arange(c), torch.arange(r), indexing="xy"), -1).reshape(-1, 2)
        cands.insert(0, ("kw", (), {"pixel_values": torch.rand(BATCH, r * c, ch * p * p, generator=g),
                                    "pixel_position_ids": pos.expand(BATCH, -1, -1).clone()}))

    if "returns_to_go" in sig and isinstance(getattr(cfg, "state_dim", None), int):
        # Decision Transformer: a trajectory of states, actions, rewards and returns
        t = SEQ // 2
        cands.insert(0, ("kw", (), {"states": torch.randn(BATCH, t, cfg.state_dim, generator=g),
                                    "actions": torch.randn(BATCH, t, cfg.act_dim, generator=g),
                                    "rewards": torch.randn(BATCH, t, 1, generator=g),
                                    "returns_to_go": torch.randn(BATCH, t, 1, generator=g),
                                    "timesteps": torch.arange(t).repeat(BATCH, 1),
                                    "attention_mask": torch.ones(BATCH, t, dtype=torch.long)}))

    if "past_time_features" in required and isinstance(getattr(cfg, "prediction_length", None), int):
        # probabilistic forecasters (Time Series Transformer, Informer, Autoformer): a context
        # window plus the largest lag of past values, the prediction window of future ones
        lags = getattr(cfg, "lags_sequence", None) or [1]
        n, f = (getattr(cfg, "context_length", None) or cfg.prediction_length) + max(lags), cfg.prediction_length
        tf = getattr(cfg, "num_time_features", 0) + getattr(cfg, "num_dynamic_real_features", 0)
        c = getattr(cfg, "input_size", 1)
        shape = (lambda t: (BATCH, t)) if c == 1 else (lambda t: (BATCH, t, c))
        cands.insert(0, ("kw", (), {"past_values": torch.randn(*shape(n), generator=g),
                                    "past_time_features": torch.randn(BATCH, n, tf, generator=g),
                                    "past_observed_mask": torch.ones(*shape(n)),
                                    "future_values": torch.randn(*shape(f), generator=g),
                                    "future_time_features": torch.randn(BATCH, f, tf, generator=g)}))

    if "past_values_padding" in sig and isinstance(getattr(cfg, "patch_length", None), int):
        # TimesFM: a series of whole patches, nothing padded, one frequency class per series
        n = 4 * cfg.patch_length
        x = {"past_values": torch.randn(BATCH, n, generator=g), "past_values_padding": torch.zeros(BATCH, n)}
        if "freq" in required:
            x["freq"] = torch.zeros(BATCH, 1, dtype=torch.long)
        cands.insert(0, ("kw", (), x))
    elif "past_values" in required and "forecast_context_len" in sig and isinstance(getattr(cfg, "patch_length", None), int):
        # TimesFM 2.5's forecaster: a list of 1-D series of whole patches
        n = 4 * cfg.patch_length
        cands.insert(0, ("kw", (), {"past_values": [torch.randn(n, generator=g) for _ in range(BATCH)]}))

    gname = next((n for n in ("grid_thw", "image_grid_thw") if n in required), None)
    if gname and ("hidden_states" in required or "pixel_values" in required):
        # Qwen-VL style vision towers: flattened patches of BATCH images, each a grid of
        # (1, 2*merge, 2*merge) patches; a patch is (channels * temporal patch * p * p)
        # values, or a (channels, p, p) image where the tower embeds with a conv
        p = _get([vis], "patch_size", default=14)
        p = p[0] if isinstance(p, (list, tuple)) else p
        tp = _get([vis], "temporal_patch_size", default=1)
        tp = tp[0] if isinstance(tp, (list, tuple)) else tp
        m = _get([vis], "spatial_merge_size", "merge_size", default=2)
        c = _get([vis], "in_channels", "num_channels", default=3)
        grid = torch.tensor([[1, 2 * m, 2 * m]] * BATCH)
        n = int(grid.prod(-1).sum())
        first = "hidden_states" if "hidden_states" in required else "pixel_values"
        patches = [torch.randn(n, c * tp * p * p, generator=g)]
        if tp == 1:  # a temporal patch size the config does not name
            patches.append(torch.randn(n, c * 2 * p * p, generator=g))
        patches.append(torch.randn(n, c, p, p, generator=g))
        for x in reversed(patches):
            kw = {first: x, gname: grid}
            if "merge_sizes" in required:
                kw["merge_sizes"] = torch.tensor([m] * BATCH)
            cands.insert(0, ("kw", (), kw))
        # Inkling 2: one (merge * p, merge * p, channels) pixel block per merged token, the
        # grid counted in merged tokens
        cands.insert(len(patches), ("kw", (), {first: torch.randn(n // (m * m), m * p, m * p, c, generator=g),
                                               gname: torch.tensor([[1, 2, 2]] * BATCH)}))

    if "noise" in sig and isinstance(_get([vis], "patch_size"), int):
        # masked autoencoders shuffle patches by this noise; drawn here it is the same on CPU and tpu
        n = (h // _get([vis], "patch_size")) * (w // _get([vis], "patch_size"))
        noise = torch.rand(BATCH, n, generator=g)
        for _, _, x in cands:
            if "pixel_values" in x:
                x["noise"] = noise

    cbv, ncb = _get([cfg], "codebook_vocab_size"), _get([cfg], "num_codebooks")
    if main == "input_ids" and isinstance(cbv, int) and isinstance(ncb, int) and cands:
        # Kyutai STT: a text token and one token per audio codebook at each step (batch, seq, 1 + codebooks)
        t = torch.randint(3, max(4, min(vocab, cbv)), (BATCH, SEQ, 1 + ncb), generator=g)
        cands.append(("kw", (), {"input_ids": t, **({"attention_mask": torch.ones(BATCH, SEQ, dtype=torch.long)}
                                                    if "attention_mask" in sig else {})}))
    ncb = _get([text, cfg], "num_codebooks")
    if isinstance(ncb, int) and ncb > 1:
        # audio-token decoders (MusicGen) take one id row per codebook: (batch * codebooks, seq)
        doc = inspect.getdoc(model.forward) or ""
        flat = re.findall(r"(\w+) \(`torch.LongTensor` of shape `\(batch_size \* num_codebooks", doc)
        for _, _, x in cands:
            for n in flat:
                if isinstance(x.get(n), torch.Tensor) and x[n].dim() == 2:
                    x[n] = ids((x[n].shape[0] * ncb, x[n].shape[1]))
                    m = n.replace("input_ids", "attention_mask")
                    if m != n and isinstance(x.get(m), torch.Tensor) and m.startswith("decoder"):
                        x[m] = torch.ones_like(x[n])

    if "hidden_states" in required and main != "hidden_states" and not any("hidden_states" in x for _, _, x in cands):
        # towers whose forward takes `hidden_states` (codec encoders and decoders): the main
        # input under that name, or latents (batch, width, frames) / (batch, frames, width)
        width = _get([cfg], "hidden_size", "d_model", default=64)
        cands = [(k, a, {("hidden_states" if n == main and main not in sig else n): v for n, v in x.items()})
                 for k, a, x in cands]
        cands += [("kw", (), {"hidden_states": torch.randn(BATCH, width, SEQ, generator=g)}),
                  ("kw", (), {"hidden_states": torch.randn(BATCH, SEQ, width, generator=g)})]

    if "noise" in sig and isinstance(_get([cfg], "masked_unit_size"), (list, tuple)) \
            and isinstance(_get([cfg], "patch_stride"), (list, tuple)):
        # Hiera's pre-training masks whole mask units, shuffled by this noise
        n = 1
        for size, st, mu in zip((h, w), cfg.patch_stride, cfg.masked_unit_size):
            n *= max(1, size // st // mu)
        noise = torch.rand(BATCH, n, generator=g)
        for _, _, x in cands:
            if "pixel_values" in x:
                x["noise"] = noise

    # last resort for video models taking `pixel_values`: the same inputs with clips
    frames = _get([vis, cfg], "num_frames", default=4)
    frames = frames if isinstance(frames, int) and 0 < frames <= 16 else 4
    for _, _, x in list(cands):
        if isinstance(x.get("pixel_values"), torch.Tensor) and x["pixel_values"].dim() == 4 \
                and "pixel_values" in sig and x["pixel_values"].shape[1] == ch:
            cands.append(("last", (), dict(x, pixel_values=torch.randn(BATCH, frames, ch, h, w, generator=g))))

    # last resort for Q-Former models (BLIP-2, InstructBLIP): the query outputs replace
    # image placeholder tokens, num_query_tokens per image (per frame for video)
    nq = _get([cfg], "num_query_tokens")
    tok = _get([cfg], "image_token_index", "image_token_id", "video_token_index", "video_token_id")
    if isinstance(nq, int) and isinstance(tok, int) and 0 <= tok < _VOCAB:
        for _, _, x in list(cands):
            pv, t = x.get("pixel_values"), x.get("input_ids")
            if isinstance(pv, torch.Tensor) and isinstance(t, torch.Tensor) and t.dim() == 2:
                n = nq * (pv.shape[1] if pv.dim() == 5 else 1)
                t = torch.cat([torch.full((t.shape[0], n), tok, dtype=t.dtype), t], 1)
                y = dict(x, input_ids=t)
                if "attention_mask" in y:
                    y["attention_mask"] = torch.ones_like(t)
                cands.append(("last", (), y))

    if "latents" in required:
        # codec decoders (Mimi's, Pocket TTS's): continuous latents (batch, width, frames)
        for wd in dict.fromkeys(x for x in (_get([cfg], "latent_dim"), _get([cfg], "codebook_dim"),
                                           _get([cfg], "hidden_size")) if isinstance(x, int)):
            cands.insert(0, ("kw", (), {"latents": torch.randn(BATCH, wd, SEQ, generator=g)}))
    if "classes_structure" in required:
        # OmDet-Turbo: 3 class prompts per image (tokenized, flattened over the batch) and a task prompt
        k = 3
        cands.insert(0, ("kw", (), {"pixel_values": pixels, "classes_input_ids": ids((BATCH * k, 8)),
                                    "classes_attention_mask": torch.ones(BATCH * k, 8, dtype=torch.long),
                                    "tasks_input_ids": ids((BATCH, SEQ)),
                                    "tasks_attention_mask": torch.ones(BATCH, SEQ, dtype=torch.long),
                                    "classes_structure": torch.full((BATCH,), k, dtype=torch.long)}))
    if "audio_mel" in required and isinstance(_get([cfg], "input_feat_size"), int):
        # Gemma 3n's audio encoder: (batch, frames, mel bins) and its padding mask (none padded)
        cands.insert(0, ("kw", (), {"audio_mel": torch.randn(BATCH, 64, cfg.input_feat_size, generator=g),
                                    "audio_mel_mask": torch.zeros(BATCH, 64, dtype=torch.bool)}))
    nt = _get([vis, cfg], "max_num_tiles")
    if "aspect_ratio_ids" in required and isinstance(nt, int):
        # Mllama vision: one image of max_num_tiles tiles per sample, aspect ratio id 1 (one
        # tile used, the rest masked)
        mask = torch.zeros(BATCH, 1, nt, dtype=torch.long)
        mask[..., 0] = 1
        cands.insert(0, ("kw", (), {"pixel_values": torch.randn(BATCH, 1, nt, ch, h, w, generator=g),
                                    "aspect_ratio_ids": torch.ones(BATCH, 1, dtype=torch.long),
                                    "aspect_ratio_mask": mask}))
    pe = _get([vis], "patch_embed_hidden_size")
    if main == "flattened_patches" and isinstance(pe, int):
        # Pix2Struct: each patch is (row, column, its pixels), an 8 x 8 grid per image
        rc = torch.stack(torch.meshgrid(torch.arange(1, 9), torch.arange(1, 9), indexing="ij"), -1).reshape(-1, 2)
        fp = torch.cat([rc.float().expand(BATCH, -1, -1), torch.randn(BATCH, 64, pe, generator=g)], -1)
        cands.insert(0, ("kw", (), add_decoder({"flattened_patches": fp,
                                                "attention_mask": torch.ones(BATCH, 64)})))
    p = _get([vis, cfg], "patch_size")
    if "target_sizes" in sig and main == "pixel_values" and isinstance(p, int):
        # packed vision towers (MiniCPM-V): the patches of BATCH images side by side in one
        # row, each image a (rows, cols) grid of patches given by target_sizes
        r = max(2, min(h, w) // p // 2 * 2)
        cands.append(("kw", (), {"pixel_values": torch.randn(1, ch, p, p * BATCH * r * r, generator=g),
                                 "target_sizes": torch.tensor([[r, r]] * BATCH, dtype=torch.int32)}))
    if "decoder_input_values" in sig:
        # SpeechT5: the decoder takes spectrogram frames (text-to-speech) or, without the
        # pre-nets (the bare model), hidden states, like its encoder
        wd = _get([cfg], "hidden_size", "d_model", default=64)
        for _, _, x in list(cands):
            if "decoder_input_values" not in x:
                cands += [("kw", (), dict(x, decoder_input_values=torch.randn(BATCH, SEQ // 2, n, generator=g)))
                          for n in dict.fromkeys((mel_bins, wd))]
        if main == "input_values":
            cands.append(("kw", (), {"input_values": torch.randn(BATCH, SEQ, wd, generator=g),
                                     "decoder_input_values": torch.randn(BATCH, SEQ // 2, wd, generator=g)}))
    ehs = _get([cfg], "encoder_hidden_size")
    if "encoder_hidden_states" in sig and isinstance(ehs, int):
        # a Q-Former on its own: its queries cross-attend to image features of this width
        for _, _, x in list(cands):
            if "encoder_hidden_states" not in x:
                cands.append(("last", (), dict(x, encoder_hidden_states=torch.randn(BATCH, 8, ehs, generator=g))))
    if main == "input_ids" and "input_features" in sig and cands:
        # text-audio models (CLAP, CLVP): text and audio features together
        base = cands[0][2]
        cands += [("kw", (), dict(base, input_features=f)) for f in audio_features()]
        if "is_longer" in sig:  # CLAP: one channel of (frames, mel bins), none longer than the window
            cands.append(("kw", (), dict(base, input_features=torch.randn(BATCH, 1, 64, mel_bins, generator=g),
                                         is_longer=torch.zeros(BATCH, 1, dtype=torch.bool))))

    def boxes():  # layout models: (x0, y0, x1, y1) in 0..1000 with x0 <= x1, y0 <= y1
        a, b = torch.randint(0, 500, (2, BATCH, SEQ, 2), generator=g)
        return torch.cat([a, a + b], -1)
    hidden = _get([text, cfg], "hidden_size", "d_model", default=64)
    fill = {"input_ids": lambda: ids(), "pixel_values": lambda: pixels, "bbox": boxes,
            "qformer_input_ids": lambda: ids(), "qformer_attention_mask": lambda: torch.ones(BATCH, SEQ, dtype=torch.long),
            "query_embeds": lambda: torch.randn(BATCH, SEQ, hidden, generator=g),
            "prompt_pixel_values": lambda: pixels, "prompt_masks": lambda: pixels.clone(),
            "pixel_values_videos": lambda: torch.randn(BATCH, 4, ch, h, w, generator=g),
            # OneFormer: the tokenized task prompt ("the task is semantic"), task_seq_len long
            "task_inputs": lambda: ids((BATCH, _get([cfg], "task_seq_len", default=SEQ)))}
    for _, _, x in cands:  # required arguments the generators above left out
        for n in required + [n for n in ("bbox",) if n in sig]:
            if n not in x and n in fill:
                x[n] = fill[n]()
            elif n not in x and n.endswith("_mask") and isinstance(x.get(n[:-5]), torch.Tensor):
                # a padding mask for a feature input (audio frames): nothing padded
                f = x[n[:-5]]
                x[n] = torch.ones(f.shape[0], f.shape[1] if f.dim() > 2 and f.shape[1] != mel_bins else f.shape[-1],
                                  dtype=torch.bool)
    p = _get([vis, cfg], "patch_size")
    if "bool_masked_pos" in required and isinstance(p, int):
        # masked-video pre-training (VideoMAE): every other patch (tubelet) masked, the same
        # number in each sample
        t = _get([vis, cfg], "tubelet_size", default=1)
        for _, _, x in cands:
            pv = x.get("pixel_values")
            if isinstance(pv, torch.Tensor) and pv.dim() in (4, 5) and "bool_masked_pos" not in x:
                n = (pv.shape[-2] // p) * (pv.shape[-1] // p) * (pv.shape[1] // t if pv.dim() == 5 else 1)
                x["bool_masked_pos"] = (torch.arange(n) % 2 == 0).expand(pv.shape[0], n).clone()
    for k, a, x in list(cands):
        # padding masks a forward takes as optional but needs (AudioFlamingo 3's encoder):
        # the same inputs with nothing padded, tried after them
        extra = {}
        for n in sig:
            f = x.get(n[:-5]) if n.endswith("_mask") and n != "attention_mask" else None
            if n not in x and isinstance(f, torch.Tensor) and f.is_floating_point() and f.dim() == 3:
                extra[n] = torch.ones(f.shape[0], f.shape[1] if f.shape[1] != mel_bins else f.shape[-1],
                                      dtype=torch.bool)
        if extra:
            cands.append(("last", a, dict(x, **extra)))
    for k, a, x in list(cands):
        # models that work for one sample only (TVP's position table is shaped by the batch
        # size where it means the batch of frames): the same inputs, the first sample
        if not a and x and all(isinstance(v, torch.Tensor) and v.dim() >= 2 and v.shape[0] == BATCH for v in x.values()):
            cands.append(("last", a, {n: v[:1] for n, v in x.items()}))
    return cands


# ----------------------------------------------------------------------------- timm

_TIMM_DEPTHS = ("layers", "depths", "stages", "num_blocks_list", "block_repeats", "num_blocks")


_TIMM_WIDTHS = ("embed_dim", "embed_dims", "dims", "widths", "channels", "w0", "wa", "group_size",
                "stem_width", "stem_chs", "num_features")


def _narrow(x, div):
    """x / div, a multiple of 8 when x is one (channel counts quantized to 8)."""
    if isinstance(x, float):
        return x / div
    y = x // div
    return max(8, y // 8 * 8) if x % 8 == 0 else y


def _timm_shrink(v, key="", widths=0):
    """Fewer blocks per stage in one timm constructor argument (kwargs, a model-config
    dataclass, an hrnet stage dict or decoded EfficientNet block args). widths: also a
    quarter of the channel widths (only tried when fewer blocks are not enough: group
    sizes, SE ratios and head splits are tied to them, so it fails for some models)."""
    import dataclasses
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        ch = {f.name: _timm_shrink(getattr(v, f.name), f.name, widths) for f in dataclasses.fields(v)}
        if type(v).__name__ == "ByoBlockCfg" and isinstance(v.d, int):
            ch["d"] = min(v.d, 1)
        if type(v).__name__ == "RegNetCfg":
            ch["depth"] = v.depth  # RegNet's depth is spread over exactly 4 stages
        return dataclasses.replace(v, **{k: x for k, x in ch.items() if x is not getattr(v, k)})
    if widths and key in _TIMM_WIDTHS and not isinstance(v, bool):
        if isinstance(v, (int, float)) and v >= 32:
            return _narrow(v, widths)
        if isinstance(v, (list, tuple)) and v and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            return type(v)(_narrow(x, widths) if x >= 32 else x for x in v)
    if widths and key == "width_factor" and isinstance(v, int) and v > 1:
        return 1
    if isinstance(v, dict):
        out = {k: _timm_shrink(x, k, widths) for k, x in v.items()}
        if isinstance(out.get("num_modules"), int):
            out["num_modules"] = 1
        return out
    ints = isinstance(v, (list, tuple)) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
    if key in _TIMM_DEPTHS and ints:
        return type(v)(min(x, 1) for x in v)
    if key in ("depth", "num_blocks") and isinstance(v, int) and not isinstance(v, bool) and v > 2:
        return 2
    if key == "block_args" and isinstance(v, (list, tuple)) and v and all(isinstance(x, list) and x for x in v):
        return [stage[:1] for stage in v]  # the first block of a stage carries its stride
    if isinstance(v, (list, tuple)) and key in ("blocks",):
        return type(v)(_timm_shrink(x, "", widths) for x in v)
    return v


def _timm_shrunk_kwargs(kw, cls_name, widths=0):
    old = kw.get("depth")
    kw = {k: _timm_shrink(v, k, widths) for k, v in kw.items()}
    if isinstance(old, int) and kw.get("depth") != old:  # per-block tuples follow the depth
        for k, v in kw.items():
            if isinstance(v, (list, tuple)) and len(v) == old:
                kw[k] = type(v)(v[:kw["depth"]])
    if cls_name == "VGG":  # the 4096-wide 7x7 head holds most of the weights
        kw["mlp_ratio"] = 0.25
    return kw


class _timm_shrinking:
    """Shrinks the arguments timm's entrypoints hand to build_model_with_cfg (each model
    module imports it by name, so it is patched there) while the context is active."""
    def __init__(self, widths=0):
        self.widths = widths

    def __enter__(self):
        import sys
        import timm.models._builder as B
        self.orig = orig = B.build_model_with_cfg

        def build(model_cls, variant, pretrained, *a, **kw):
            return orig(model_cls, variant, pretrained, *a, **_timm_shrunk_kwargs(kw, model_cls.__name__, self.widths))
        self.mods = [m for m in list(sys.modules.values()) if getattr(m, "__name__", "").startswith("timm.models.")
                     and getattr(m, "build_model_with_cfg", None) is orig]
        for m in self.mods:
            m.build_model_with_cfg = build
        return self

    def __exit__(self, *exc):
        for m in self.mods:
            m.build_model_with_cfg = self.orig


def _timm_build(name, variant=0, img=IMG):
    import timm
    if variant == 2:
        # variant 0 built for images of a multiple of the patch size (patch 14: 56x56)
        pe = next((m for n, m in _timm_build(name, 0).model.named_modules() if n.endswith("patch_embed")), None)
        p = getattr(pe, "patch_size", None)
        p = p[0] if isinstance(p, (tuple, list)) else p
        if not (isinstance(p, int) and p > 1 and IMG % p):
            raise SameAsBefore("the patch size divides the image size")
        return _timm_build(name, 0, img=p * max(1, round(IMG / p)))
    # (kwargs, shrink): the plain model first; when it is over MAX_PARAMS, fewer blocks per
    # stage ("blocks"), then also narrower stages ("blocks+widths")
    tries = [(dict(img_size=img, depth=2, embed_dim=64, num_heads=2), None), (dict(img_size=img), None),
             ({}, None), (dict(img_size=img), "blocks"), ({}, "blocks"),
             (dict(img_size=img), 4), ({}, 4), (dict(img_size=img), 2), ({}, 2)]  # 4, 2: widths / 4, / 2
    if variant:
        tries = [t for t in tries if not t[0]]
    last = None
    too_large = None
    for kw, shrink in tries:
        ctx = _timm_shrinking(widths=0 if shrink == "blocks" else shrink) if shrink else contextlib.nullcontext()
        try:
            with ctx:
                _check_size(lambda: timm.create_model(name, pretrained=False, num_classes=10, **kw))
                torch.manual_seed(0)
                model = timm.create_model(name, pretrained=False, num_classes=10, **kw)
            _check_built_size(model)
            break
        except Excluded as e:
            too_large = e
        except Exception as e:
            last = e
    else:
        if too_large is not None:
            raise too_large
        raise Excluded(f"construction failed: {type(last).__name__}: {str(last)[:200]}")
    if shrink:
        kw = dict(kw, blocks_per_stage="shrunk", **({"widths": f"1/{shrink}"} if shrink != "blocks" else {}))
    model.eval()
    cfg = getattr(model, "pretrained_cfg", {}) or {}
    c, h, w = cfg.get("input_size", (3, 224, 224))
    if "img_size" in kw:
        sizes = [(img, img)]
    else:
        sizes = [(IMG, IMG), (96, 96), (128, 128), (h, w)]
        if cfg.get("fixed_input_size"):
            sizes = [(h, w)]
    g = torch.Generator().manual_seed(0)
    cands = [("args", (torch.randn(BATCH, c, hh, ww, generator=g),), {}) for hh, ww in dict.fromkeys(sizes)]
    return Built(model, cands, note=str(kw) if kw else "")


# ----------------------------------------------------------------------------- torchvision

class _tv_shrinking:
    """One block per stage (two encoder layers for ViT) in torchvision's family builders
    (module-level functions each model entrypoint calls by name) while active."""
    @staticmethod
    def _one_per_stage(settings):
        out = []
        for c in settings:
            c = copy.copy(c)
            c.num_layers = 1
            out.append(c)
        return out

    @staticmethod
    def _regnet_params(p):
        p = copy.copy(p)  # a quarter of the widths, in whole groups (group widths quartered too)
        p.depths = [1] * len(p.depths)
        p.group_widths = [max(1, w // 4) for w in p.group_widths]
        p.widths = [max(g, w // 4 // g * g) for w, g in zip(p.widths, p.group_widths)]
        return p

    def __enter__(self):
        import torchvision.models as tvm
        edits = {"layers": lambda v: [1] * len(v),
                 "num_layers": lambda v: min(v, 2),
                 "block_params": self._regnet_params,
                 "block_setting": self._one_per_stage,
                 "inverted_residual_setting": self._one_per_stage}
        self.saved = []
        for mod, fn in ((tvm.resnet, "_resnet"), (tvm.vision_transformer, "_vision_transformer"),
                        (tvm.regnet, "_regnet"), (tvm.convnext, "_convnext"), (tvm.efficientnet, "_efficientnet")):
            orig = getattr(mod, fn)
            sig = inspect.signature(orig)

            def shrunk(*a, _orig=orig, _sig=sig, **kw):
                b = _sig.bind(*a, **kw)
                for k, f in edits.items():
                    if k in b.arguments:
                        b.arguments[k] = f(b.arguments[k])
                return _orig(*b.args, **b.kwargs)
            self.saved.append((mod, fn, orig))
            setattr(mod, fn, shrunk)
        return self

    def __exit__(self, *exc):
        for mod, fn, orig in self.saved:
            setattr(mod, fn, orig)


def _tv_build(kind, name):
    import torchvision.models as tvm
    g = torch.Generator().manual_seed(0)
    base = dict(weights=None)
    if kind == "classification":
        tries = [dict(base, num_classes=10, image_size=IMG), dict(base, num_classes=10)]
    elif kind == "segmentation":
        tries = [dict(base, num_classes=5, weights_backbone=None, aux_loss=False)]
    elif kind == "detection":
        # SSD entrypoints set their own min_size
        tries = [dict(base, num_classes=5, weights_backbone=None, min_size=IMG, max_size=96),
                 dict(base, num_classes=5, weights_backbone=None)]
    elif kind == "video":
        tries = [dict(base, num_classes=10)]
    else:
        tries = [dict(base)]
    last = too_large = None
    for kw, shrink in [(kw, False) for kw in tries] + [(kw, True) for kw in tries]:
        try:
            with _tv_shrinking() if shrink else contextlib.nullcontext():
                _check_size(lambda: tvm.get_model(name, **kw))
                torch.manual_seed(0)
                model = tvm.get_model(name, **kw)
            _check_built_size(model)  # when the meta-device count above could not run
            break
        except Excluded as e:
            too_large = e
        except Exception as e:
            last = e
    else:
        if too_large is not None:
            raise too_large
        raise Excluded(f"construction failed: {type(last).__name__}: {str(last)[:200]}")
    if shrink:
        kw = dict(kw, blocks_per_stage="shrunk")
    model.eval()
    if kind in ("classification", "segmentation"):
        cands = [("args", (torch.randn(BATCH, 3, s, s, generator=g),), {}) for s in (IMG, 96, 128, 224)]
    elif kind == "detection":
        cands = [("args", ([torch.rand(3, IMG, IMG, generator=g) for _ in range(BATCH)],), {})]
    elif kind == "video":
        cands = [("args", (torch.randn(1, 3, 4, 32, 32, generator=g),), {}),
                 ("args", (torch.randn(1, 3, 16, 64, 64, generator=g),), {}),
                 # the clip size the weights were made for (MViT's position tables, S3D's pool)
                 ("args", (torch.randn(1, 3, 16, 224, 224, generator=g),), {})]
    else:
        im = [torch.randn(1, 3, 128, 128, generator=g) for _ in range(2)]
        cands = [("kw", (im[0], im[1]), {"num_flow_updates": 2})]
    return Built(model, cands, note=str({k: v for k, v in kw.items() if v is not None}))


def variants(model_id):
    """How many build variants to try (the next one when the CPU reference fails)."""
    # hf: 0 full shrink, 1 keeping image sizes and positions, 2 only layers/vocab/experts,
    # each with every layer type kept, then with the first two layers
    # then 0 and 2 with repairs for configs the model rejects (see _hf_build)
    # timm: 0 built for 64x64 images where the constructor takes img_size, 1 as defined,
    # 2 as 0 for a multiple of the patch size
    return {"hf": 8, "timm": 3}.get(model_id.split("/", 1)[0], 1)


def build(model_id, variant=0):
    src, rest = model_id.split("/", 1)
    if src == "hf":
        mt, cls = rest.split("/")
        b = _hf_build(mt, cls, variant)
    elif src == "timm":
        b = _timm_build(rest, variant)
    elif src == "tv":
        kind, name = rest.split("/")
        b = _tv_build(kind, name)
    else:
        raise ValueError(model_id)
    b.params = sum(p.numel() for p in b.model.parameters())
    if b.params > MAX_PARAMS:
        raise Excluded(f"too large after shrinking ({b.params / 1e6:.0f}M parameters)")
    if not b.candidates:
        raise Excluded("no input generator for this model's forward signature")
    return b
