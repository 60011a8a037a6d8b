"""Validation at scale: real model architectures on tpu vs PyTorch CPU.

    python -m torchtpu.validate                      # every model, results appended (resumable)
    python -m torchtpu.validate --shard 0/2          # every second model (run 1/2 in another process)
    python -m torchtpu.validate --sample ci          # the fixed CI sample (~50 models)
    python -m torchtpu.validate --only timm/resnet18 hf/bert/BertModel
    python -m torchtpu.validate --list               # print the enumeration
    python -m torchtpu.validate --compiled --limit 300   # torch.compile(backend="tpu"), a sample
    python -m torchtpu.validate --report             # render docs/validation.md from the results

Models: every Hugging Face transformers architecture in the auto mappings (each task-head
class), every timm model and every torchvision classification, segmentation, detection,
video and optical-flow model, built tiny with random weights; nothing is downloaded. Each
model runs on CPU (the reference) and then with the same weights and inputs on tpu in each
eager mode (strict, defer_and_fuse); every output tensor is compared with the per-dtype
tolerances of torchtpu/_tolerances.py. A mode passes only with matching outputs and no op
on the CPU fallback. A sample of models (--train-every) also runs one training step
(loss and every gradient vs CPU). Each model runs in a worker subprocess with a timeout.
--compiled runs the mode "compiled" instead (`torch.compile(model, backend="tpu")`, see
torchtpu/_validate/runner.py) into its own results file, which the report shows in its own
section."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_RESULTS = os.path.join(ROOT, "build", "validation", "results.jsonl")
COMPILED_RESULTS = os.path.join(ROOT, "build", "validation", "compiled.jsonl")
DEFAULT_REPORT = os.path.join(ROOT, "docs", "validation.md")

# The CI sample: fixed, across the three sources; each is small enough to run in seconds.
# Entries name an id, or for transformers a class name (resolved against the enumeration).
CI_SAMPLE = [
    # transformers: encoders, decoders, encoder-decoders, vision, audio, multimodal, MoE
    "BertModel", "BertForMaskedLM", "BertForSequenceClassification", "RobertaForTokenClassification",
    "DistilBertForQuestionAnswering", "AlbertForMultipleChoice", "ElectraForPreTraining",
    "GPT2LMHeadModel", "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
    "GemmaForCausalLM", "PhiForCausalLM", "OPTForCausalLM", "MixtralForCausalLM",
    "T5ForConditionalGeneration", "BartForConditionalGeneration", "ViTForImageClassification",
    "SwinForImageClassification", "ConvNextForImageClassification", "ResNetForImageClassification",
    "CLIPModel", "Wav2Vec2ForCTC", "WhisperForConditionalGeneration",
    # timm
    "timm/resnet18", "timm/efficientnet_b0", "timm/mobilenetv3_small_100", "timm/convnext_atto",
    "timm/vit_tiny_patch16_224", "timm/deit_tiny_patch16_224", "timm/regnetx_002",
    "timm/densenet121", "timm/mixer_s16_224", "timm/levit_128s", "timm/ghostnet_100",
    "timm/efficientvit_b0", "timm/swin_tiny_patch4_window7_224",
    # torchvision
    "tv/classification/resnet18", "tv/classification/mobilenet_v2",
    "tv/classification/mobilenet_v3_small", "tv/classification/efficientnet_b0",
    "tv/classification/squeezenet1_0", "tv/classification/shufflenet_v2_x0_5",
    "tv/classification/densenet121", "tv/classification/regnet_x_400mf",
    "tv/classification/convnext_tiny", "tv/segmentation/lraspp_mobilenet_v3_large",
    "tv/detection/fasterrcnn_mobilenet_v3_large_320_fpn", "tv/video/r3d_18",
]
# CI models that also run one training step
CI_TRAIN = {"BertForSequenceClassification", "GPT2LMHeadModel", "LlamaForCausalLM",
            "T5ForConditionalGeneration", "ViTForImageClassification", "timm/resnet18",
            "timm/vit_tiny_patch16_224", "tv/classification/mobilenet_v3_small"}


def resolve(names, all_ids):
    by_class = {}
    for i in all_ids:
        if i.startswith("hf/"):
            by_class.setdefault(i.rsplit("/", 1)[1], i)
    out = []
    for n in names:
        if "/" not in n:
            if n not in by_class:
                raise SystemExit(f"unknown transformers class {n}")
            out.append(by_class[n])
        else:
            out.append(n)
    return out


def ci_sample(all_ids=None):
    from ._validate import models
    all_ids = all_ids if all_ids is not None else models.enumerate_models()
    return resolve(CI_SAMPLE, all_ids), set(resolve(sorted(CI_TRAIN), all_ids))


def _stable_hash(s):
    return int(hashlib.sha1(s.encode()).hexdigest()[:8], 16)


def run_order(ids):
    """A stable pseudo-random order: any prefix of a run (or of a shard) is a uniform
    sample across the three sources."""
    return sorted(ids, key=lambda i: (_stable_hash(i), i))


def load_results(path):
    res = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        r = json.loads(line)
                    except json.JSONDecodeError:
                        continue  # a line cut by a killed run
                    res[r["id"]] = r
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m torchtpu.validate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shard", default="0/1", help="i/n: run models i, i+n, i+2n, ...")
    ap.add_argument("--sample", choices=["all", "ci"], default="all")
    ap.add_argument("--only", nargs="*", help="model ids (or transformers class names)")
    ap.add_argument("--source", nargs="*", choices=["hf", "timm", "tv"], default=["hf", "timm", "tv"])
    ap.add_argument("--limit", type=int, default=0,
                    help="only the shard's first N models (its stable shuffle order, so a uniform sample; "
                         "a rerun with the same N resumes the same sample)")
    ap.add_argument("--results", default=None,
                    help="JSON-lines results (appended; default build/validation/results.jsonl, "
                         "with --compiled build/validation/compiled.jsonl)")
    ap.add_argument("--compiled", action="store_true",
                    help='run torch.compile(model, backend="tpu") (the mode "compiled") instead of the eager modes')
    ap.add_argument("--workers", type=int, default=1, help="worker subprocesses in this process")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    ap.add_argument("--timeout", type=float, default=360.0, help="seconds per model")
    ap.add_argument("--modes", nargs="*", default=["strict", "defer_and_fuse"])
    ap.add_argument("--train-every", type=int, default=10,
                    help="also run a training step for 1 model in N (stable hash of the id)")
    ap.add_argument("--recycle", type=int, default=60, help="models per worker before a fresh one")
    ap.add_argument("--rerun", action="store_true", help="run models already in the results again")
    ap.add_argument("--retry", nargs="+", choices=["excluded", "fail"], default=None,
                    help="run again only the models whose recorded result has this status "
                         "(after a harness or runtime fix); the newest result wins in the report")
    ap.add_argument("--log", default=None, help="worker stderr goes here (default: discarded)")
    ap.add_argument("--list", action="store_true", help="print the enumerated model ids and exit")
    ap.add_argument("--report", action="store_true", help="render docs/validation.md and exit")
    ap.add_argument("--report-path", default=DEFAULT_REPORT)
    a = ap.parse_args(argv)

    if a.report:
        from ._validate import report
        report.render(a.results or DEFAULT_RESULTS, a.report_path, compiled_path=COMPILED_RESULTS)
        print(f"wrote {a.report_path}")
        return 0

    if a.compiled:
        a.modes = ["compiled"]
    a.results = a.results or (COMPILED_RESULTS if a.compiled else DEFAULT_RESULTS)
    from ._validate import models
    all_ids = models.enumerate_models(tuple(a.source))
    train_ids = set()
    if a.only:
        ids = resolve(a.only, all_ids)
    elif a.sample == "ci":
        ids, train_ids = ci_sample(all_ids)
    else:
        ids = run_order(all_ids)
    if a.sample != "ci" and a.train_every > 0:
        train_ids = {i for i in ids if _stable_hash(i) % a.train_every == 0}
    if a.list:
        for i in ids:
            print(i)
        counts = {}
        for i in ids:
            counts[models.source_of(i)] = counts.get(models.source_of(i), 0) + 1
        print(f"# {len(ids)} models: {counts}", file=sys.stderr)
        return 0
    si, sn = (int(x) for x in a.shard.split("/"))
    ids = ids[si::sn]
    if a.limit:
        ids = ids[:a.limit]
    done = load_results(a.results) if not a.rerun else {}
    if a.retry:
        todo = [i for i in ids if i in done and done[i]["status"] in a.retry]
    else:
        todo = [i for i in ids if i not in done]
    os.makedirs(os.path.dirname(os.path.abspath(a.results)), exist_ok=True)
    tag = f"[{si}/{sn}]"
    print(f"{tag} {len(ids)} models in shard, {sum(i in done for i in ids)} "
          f"already in {a.results}, running {len(todo)}", file=sys.stderr)
    counts = {"pass": 0, "fail": 0, "excluded": 0}
    t0 = time.time()
    tty = sys.stderr.isatty()
    # one write() per line on an O_APPEND file: shards running in parallel can share it
    out = os.open(a.results, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    from ._validate.report import git_build
    build = git_build()

    def on_result(r):
        r["date"] = time.strftime("%Y-%m-%d")
        r["build"] = build
        os.write(out, (json.dumps(r, default=str) + "\n").encode())
        counts[r["status"]] = counts.get(r["status"], 0) + 1
        n = sum(counts.values())
        rate = (time.time() - t0) / n
        eta = rate * (len(todo) - n)
        line = (f"{tag} {n}/{len(todo)} pass {counts['pass']} fail {counts['fail']} "
                f"excluded {counts['excluded']} | {r['status']:8s} {r['id']} "
                f"{r.get('seconds', '')}s | eta {eta / 60:.0f} min")
        print(("\r\033[K" + line) if tty else line, file=sys.stderr, end="" if tty else "\n", flush=True)

    from ._validate.pool import run_pool
    run_pool(todo, on_result, workers=a.workers, timeout=a.timeout, modes=tuple(a.modes),
             train_ids=train_ids, recycle=a.recycle, log=a.log, threads=a.threads)
    os.close(out)
    if tty:
        print(file=sys.stderr)
    print(f"{tag} done in {(time.time() - t0) / 60:.1f} min: {counts}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
