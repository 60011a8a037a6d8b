"""The OpInfo conformance sweep and its report (docs/ops.md).

    python -m torchtpu.ops_report [--shard i/n] [--jobs N] [--dtypes float32 bfloat16 ...]
                                  [--ops add sum ...] [--limit N] [--sample full|ci]
                                  [--results PATH] [--doc PATH] [--fresh]
                                  [--render-only] [--write-xfails]

Runs every OpInfo sample (torchtpu/_opinfo.py) of the selected ops and dtypes on tpu and
on CPU in --jobs worker subprocesses (default 2), appending one JSON line per sample to
--results (default build/opinfo/results.jsonl). A rerun resumes: samples already in the
file are skipped (--fresh starts over). A worker that dies (abort, segfault) or stops
making progress for longer than the per-sample budget is killed, its current sample is
recorded as "crash" or "timeout", and a new worker resumes after it. Then docs/ops.md is
rendered from the whole results file. --write-xfails regenerates the EXPECTED_FAILURES
block of tests/opinfo/tables.py (failing samples, and crashing ones as skips)."""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch  # noqa: F401  (import torch before torchtpu: the autoload entry point)

from . import _opinfo as oi

ROOT = oi.ROOT
DEFAULT_RESULTS = ROOT / "build" / "opinfo" / "results.jsonl"
DEFAULT_DOC = ROOT / "docs" / "ops.md"
DTYPE_ORDER = list(oi.DTYPES)
SHORT = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "float64": "f64",
         "int64": "i64", "int32": "i32", "bool": "bool"}


# ----------------------------------------------------------------------------- units

def parse_shard(s):
    i, n = (int(x) for x in s.split("/"))
    if not (0 <= i < n):
        raise argparse.ArgumentTypeError(f"shard {s}: need 0 <= i < n")
    return i, n


def select_units(args):
    """[(op_key, dtype_name)] of this shard, in a stable order."""
    ops = oi.load_ops()
    keys = sorted(ops)
    if args.ops:
        want = set(args.ops)
        keys = [k for k in keys if k in want or ops[k].name in want]
    units = []
    for k in keys:
        for d in oi.op_dtypes(ops[k]):
            if args.dtypes and d not in args.dtypes:
                continue
            units.append((k, d))
    i, n = args.shard
    units = units[i::n]
    return units


def load_results(path):
    recs = []
    if path.exists():
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        recs.append(json.loads(line))
                    except json.JSONDecodeError:
                        pass  # a line cut by a crash
    return recs


def _append(fd, rec):
    os.write(fd, (json.dumps(rec, sort_keys=True) + "\n").encode())


# ----------------------------------------------------------------------------- worker

def worker(args):
    """Runs units job::jobs of the shard; writes results and a state line per sample."""
    units = select_units(args)[args.job::args.jobs]
    done = collections.defaultdict(set)
    for r in load_results(args.results):
        done[(r["op"], r["dtype"])].add((r["variant"], r["i"]))
    fd = os.open(args.results, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    state = Path(args.state)
    budget = args.budget
    crash_at = os.environ.get("_TORCHTPU_OPS_REPORT_ABORT_AT")
    for n, (op_key, dtype) in enumerate(units):
        if n < args.start_unit:  # done before the previous worker of this job died
            continue
        d = done.get((op_key, dtype), set())
        if (None, -2) in d or ("_unit", -3) in d:
            continue

        def on_start(variant, i, op_key=op_key, dtype=dtype, n=n):
            _write_state(state, dict(op=op_key, dtype=dtype, variant=variant, i=i,
                                     unit=n, units=len(units), t=time.time()))
            if crash_at == f"{op_key}:{dtype}:{variant}:{i}":  # test hook: abort here
                os.abort()

        def skip_done(variant, i, d=d):
            return (variant, i) in d

        _write_state(state, dict(op=op_key, dtype=dtype, variant="samples", i=-1,
                                 unit=n, units=len(units), t=time.time()))
        try:
            for rec in oi.run_unit(op_key, dtype, limit=args.limit, budget=budget,
                                   skip_done=skip_done, on_start=on_start):
                if rec["i"] == -1 and (rec["variant"], -1) in d:
                    continue
                _append(fd, rec)
        except Exception as e:  # noqa: BLE001  a bug in the harness for this op
            _append(fd, dict(op=op_key, dtype=dtype, variant="op", i=-1, status="skip",
                             kind="harness", reason="harness error: " + oi.short_exc(e),
                             fallback={}, t=0.0))
        # The unit is complete: a resumed sweep skips it without regenerating samples.
        _append(fd, dict(op=op_key, dtype=dtype, variant="_unit", i=-3, status="done"))
    _write_state(state, dict(done=True, units=len(units), unit=len(units), t=time.time()))
    os.close(fd)


# ----------------------------------------------------------------------------- parent

def _worker_cmd(args, job, start_unit=0):
    cmd = [sys.executable, "-m", "torchtpu.ops_report", "--worker",
           "--start-unit", str(start_unit),
           "--shard", f"{args.shard[0]}/{args.shard[1]}", "--job", str(job),
           "--jobs", str(args.jobs), "--results", str(args.results),
           "--state", str(args.results) + f".state{args.shard[0]}_{job}",
           "--budget", str(args.budget)]
    if args.limit is not None:
        cmd += ["--limit", str(args.limit)]
    if args.dtypes:
        cmd += ["--dtypes", *args.dtypes]
    if args.ops:
        cmd += ["--ops", *args.ops]
    return cmd


def sweep(args):
    args.results.parent.mkdir(parents=True, exist_ok=True)
    if args.fresh and args.results.exists():
        args.results.unlink()
    if args.redo and args.results.exists():  # drop the selected units' earlier records
        units = set(select_units(args))
        keep = [line for line in args.results.read_text().splitlines(keepends=True)
                if line.strip() and (lambda r: (r.get("op"), r.get("dtype")) not in units)(
                    json.loads(line))]
        args.results.write_text("".join(keep))
    # Workers import torchtpu explicitly; autoload off avoids the circular import of
    # `python -m torchtpu.x` (torchtpu -> torch -> autoload torchtpu).
    env = dict(os.environ, TORCHTPU_FALLBACK="allow", PYTHONWARNINGS="ignore",
               TORCH_DEVICE_BACKEND_AUTOLOAD="0",
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               OPENBLAS_NUM_THREADS=os.environ.get("OPENBLAS_NUM_THREADS", "1"))
    procs = {}
    states = {}
    logs = {}
    states = {j: Path(str(args.results) + f".state{args.shard[0]}_{j}") for j in range(args.jobs)}
    for j in range(args.jobs):
        states[j].unlink(missing_ok=True)
        logs[j] = open(str(args.results) + f".log{args.shard[0]}_{j}", "ab")
        procs[j] = subprocess.Popen(_worker_cmd(args, j), env=env, stdout=logs[j],
                                    stderr=subprocess.STDOUT, cwd=ROOT)
    t0 = time.time()
    last_print = 0
    restarts = 0
    fd = os.open(args.results, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    tty = sys.stdout.isatty()
    while procs:
        time.sleep(1)
        for j, p in list(procs.items()):
            st = _read_state(states[j])
            rc = p.poll()
            stalled = st and not st.get("done") and time.time() - st["t"] > args.budget + 30
            if rc is None and not stalled:
                continue
            if rc == 0 and st and st.get("done"):
                del procs[j]
                continue
            if stalled:
                p.send_signal(signal.SIGKILL)
                p.wait()
            # The worker died or hung: record its current sample, then resume after it.
            if st and not st.get("done"):
                kind = "timeout" if stalled else "crash"
                reason = (f"no progress for {args.budget + 30}s (killed)" if stalled else
                          f"worker process died (exit status {p.returncode})")
                variant = st["variant"] if st["variant"] != "samples" else "op"
                _append(fd, dict(op=st["op"], dtype=st["dtype"], variant=variant,
                                 i=st["i"], status="fail", kind=kind, reason=reason,
                                 fallback={}, t=0.0))
                if st["i"] == -1:  # died while generating samples: give up on the unit
                    _append(fd, dict(op=st["op"], dtype=st["dtype"], variant=None, i=-2,
                                     status="skip", kind=kind, reason=reason, fallback={},
                                     t=0.0))
            elif rc != 0:
                print(f"ops_report: worker {j} exited with {rc} before starting; see "
                      f"{logs[j].name}", file=sys.stderr)
            restarts += 1
            if restarts > 2000:
                raise SystemExit("ops_report: too many worker restarts")
            start = st.get("unit", 0) if st and not st.get("done") else 0
            states[j].unlink(missing_ok=True)
            procs[j] = subprocess.Popen(_worker_cmd(args, j, start), env=env, stdout=logs[j],
                                        stderr=subprocess.STDOUT, cwd=ROOT)
        if time.time() - last_print >= (2 if tty else 30) or not procs:
            last_print = time.time()
            done = total = 0
            for j in states:
                st = _read_state(states[j])
                if st:
                    done += st.get("unit", 0)
                    total += st.get("units", 0)
            el = time.time() - t0
            line = (f"ops_report: {done}/{total or '?'} (op, dtype) units, "
                    f"{len(procs)} workers, {restarts} restarts, {el / 60:.1f} min")
            print(("\r" + line) if tty else line, end="" if tty else "\n", flush=True)
    if tty:
        print()
    os.close(fd)
    for f in logs.values():
        f.close()


def _write_state(path, d):
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(d))
    os.replace(tmp, path)


def _read_state(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# ----------------------------------------------------------------------------- models

def _tiny_models():
    """Tiny inline versions of common architectures: (name, model, input, loss_fn)."""
    import torch.nn as nn
    import torch.nn.functional as F

    V, D, H, T, B = 64, 32, 4, 8, 2

    class Attn(nn.Module):
        def __init__(self, causal, bias=True, rope=False, relbias=False):
            super().__init__()
            self.qkv = nn.Linear(D, 3 * D, bias=bias)
            self.o = nn.Linear(D, D, bias=bias)
            self.causal, self.rope, self.relbias = causal, rope, relbias
            if relbias:
                self.rel = nn.Embedding(32, H)

        def forward(self, x, mem=None):
            b, t, _ = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, H, D // H).permute(2, 0, 3, 1, 4)
            if self.rope:
                pos = torch.arange(t, device=x.device, dtype=torch.float32)
                inv = 1.0 / (10000 ** (torch.arange(0, D // H, 2, device=x.device).float()
                                       / (D // H)))
                ang = torch.outer(pos, inv)
                cos, sin = ang.cos().repeat(1, 2), ang.sin().repeat(1, 2)

                def rot(z):
                    z1, z2 = z.chunk(2, dim=-1)
                    return z * cos + torch.cat([-z2, z1], dim=-1) * sin
                q, k = rot(q), rot(k)
            if self.relbias:
                pos = torch.arange(t, device=x.device)
                rel = (pos[None, :] - pos[:, None]).clamp(-15, 16) + 15
                bias = self.rel(rel).permute(2, 0, 1).unsqueeze(0)
                att = (q @ k.transpose(-1, -2)) / (D // H) ** 0.5 + bias
                if self.causal:
                    mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
                    att = att.masked_fill(~mask, float("-inf"))
                y = att.softmax(-1) @ v
            else:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
            return self.o(y.transpose(1, 2).reshape(b, t, D))

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(D))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w

    class GPT2Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
            self.attn = Attn(True)
            self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(approximate="tanh"),
                                     nn.Linear(4 * D, D), nn.Dropout(0.1))

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class GPT2(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T, D)
            self.blocks = nn.ModuleList([GPT2Block() for _ in range(2)])
            self.ln = nn.LayerNorm(D)

        def forward(self, idx):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for b in self.blocks:
                x = b(x)
            return F.linear(self.ln(x), self.wte.weight)

    class LlamaBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = RMSNorm(), RMSNorm()
            self.attn = Attn(True, bias=False, rope=True)
            self.g, self.u = nn.Linear(D, 2 * D, bias=False), nn.Linear(D, 2 * D, bias=False)
            self.d = nn.Linear(2 * D, D, bias=False)

        def forward(self, x):
            x = x + self.attn(self.n1(x))
            h = self.n2(x)
            return x + self.d(F.silu(self.g(h)) * self.u(h))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, D)
            self.blocks = nn.ModuleList([LlamaBlock() for _ in range(2)])
            self.n, self.head = RMSNorm(), nn.Linear(D, V, bias=False)

        def forward(self, idx):
            x = self.emb(idx)
            for b in self.blocks:
                x = b(x)
            return self.head(self.n(x))

    class Bert(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos, self.typ = nn.Embedding(V, D), nn.Embedding(T, D), \
                nn.Embedding(2, D)
            self.ln = nn.LayerNorm(D)
            layer = nn.TransformerEncoderLayer(D, H, 4 * D, dropout=0.1, activation="gelu",
                                               batch_first=True)
            self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.pool = nn.Linear(D, D)
            self.cls = nn.Linear(D, 2)

        def forward(self, idx):
            t = idx.shape[1]
            x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device)) + \
                self.typ(torch.zeros_like(idx))
            x = self.enc(F.dropout(self.ln(x), 0.1, self.training))
            return self.cls(torch.tanh(self.pool(x[:, 0])))

    class T5Block(nn.Module):
        def __init__(self, cross):
            super().__init__()
            self.n1, self.n2 = RMSNorm(), RMSNorm()
            self.attn = Attn(cross, bias=False, relbias=True)
            self.ff = nn.Sequential(nn.Linear(D, 4 * D, bias=False), nn.ReLU(),
                                    nn.Dropout(0.1), nn.Linear(4 * D, D, bias=False))

        def forward(self, x):
            x = x + self.attn(self.n1(x))
            return x + self.ff(self.n2(x))

    class T5(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, D)
            self.enc = nn.ModuleList([T5Block(False) for _ in range(2)])
            self.dec = nn.ModuleList([T5Block(True) for _ in range(2)])
            self.n = RMSNorm()

        def forward(self, idx):
            x = self.emb(idx)
            for b in self.enc:
                x = b(x)
            y = self.emb(idx.flip(1)) + x.mean(1, keepdim=True)
            for b in self.dec:
                y = b(y)
            return self.n(y) @ self.emb.weight.t()

    class ViT(nn.Module):
        def __init__(self):
            super().__init__()
            self.patch = nn.Conv2d(3, D, 4, 4)
            self.cls = nn.Parameter(torch.zeros(1, 1, D))
            self.pos = nn.Parameter(torch.randn(1, 17, D) * 0.02)
            layer = nn.TransformerEncoderLayer(D, H, 4 * D, dropout=0.0, activation="gelu",
                                               batch_first=True, norm_first=True)
            self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.ln, self.head = nn.LayerNorm(D), nn.Linear(D, 10)

        def forward(self, x):
            x = self.patch(x).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
            return self.head(self.ln(self.enc(x))[:, 0])

    class Basic(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.sc = nn.Sequential() if stride == 1 and cin == cout else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            return F.relu(self.b2(self.c2(F.relu(self.b1(self.c1(x))))) + self.sc(x))

    resnet = nn.Sequential(nn.Conv2d(3, 8, 7, 2, 3, bias=False), nn.BatchNorm2d(8),
                           nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1), Basic(8, 8, 1),
                           Basic(8, 16, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                           nn.Linear(16, 10))

    class CNBlock(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
            self.ln = nn.LayerNorm(c, eps=1e-6)
            self.p1, self.p2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
            self.gamma = nn.Parameter(torch.full((c,), 1e-6))

        def forward(self, x):
            y = self.dw(x).permute(0, 2, 3, 1)
            y = self.p2(F.gelu(self.p1(self.ln(y)))) * self.gamma
            return x + y.permute(0, 3, 1, 2)

    convnext = nn.Sequential(nn.Conv2d(3, 16, 4, 4), CNBlock(16), CNBlock(16),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.LayerNorm(16),
                             nn.Linear(16, 10))

    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, V, (B, T), generator=g)
    img = torch.randn(B, 3, 16, 16, generator=g)

    def lm_loss(out, x):
        return F.cross_entropy(out[:, :-1].reshape(-1, out.shape[-1]), x[:, 1:].reshape(-1))

    def cls_loss(out, x):
        return F.cross_entropy(out, torch.zeros(out.shape[0], dtype=torch.long,
                                                device=out.device))

    return [("gpt2", GPT2(), tokens, lm_loss), ("llama", Llama(), tokens, lm_loss),
            ("bert", Bert(), tokens, cls_loss), ("t5", T5(), tokens, lm_loss),
            ("vit", ViT(), img, cls_loss), ("resnet", resnet, img, cls_loss),
            ("convnext", convnext, img, cls_loss)]


def measure_models():
    """Per tiny model: every aten op it calls (forward, backward, AdamW step, counted on
    CPU through a dispatch mode) and the ops that went through the tpu CPU fallback."""
    import torchtpu
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.c = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.c[_aten_name(func)] += 1
            return func(*args, **(kwargs or {}))

    def step(model, x, loss_fn, dev):
        torch.manual_seed(0)
        model = model.to(dev).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(2):
            loss = loss_fn(model(x.to(dev)), x.to(dev))
            loss.backward()
            opt.step()
            opt.zero_grad()
        return loss

    calls, fallbacks = {}, {}
    prev = torchtpu.get_fallback()
    torchtpu.set_fallback("allow")
    try:
        for name, model, x, loss_fn in _tiny_models():
            import copy
            m2 = copy.deepcopy(model)
            with Count() as c:
                step(model, x, loss_fn, "cpu")
            calls[name] = dict(c.c)
            torchtpu.reset_fallback_report()
            try:
                step(m2, x, loss_fn, oi.DEV).item()
                torch.tpu.synchronize()
                fallbacks[name] = torchtpu.fallback_report()
            except Exception as e:  # noqa: BLE001
                fallbacks[name] = {"(error) " + oi.short_exc(e): 1}
    finally:
        torchtpu.set_fallback(prev)
    return calls, fallbacks


def _aten_name(func):
    s = func._schema
    return f"{s.name}.{s.overload_name}" if s.overload_name else s.name


def _base(aten):
    return aten.split("::")[-1].split(".")[0]


# ----------------------------------------------------------------------------- render

FAMILIES = [
    ("sparse", r"^(sparse\.|to_sparse)"),
    ("random", r"(rand|normal|bernoulli|dropout|multinomial|uniform|exponential|"
               r"geometric|cauchy|poisson(?!_nll)|empty)"),
    ("linalg", r"^(linalg\.|matmul|mm|bmm|addmm|addbmm|baddbmm|addmv|addr|mv|dot|vdot|"
               r"inner|outer|ger|tensordot|einsum|chain_matmul|cholesky|lu|qr|svd|"
               r"pinverse|inverse|det|logdet|slogdet|triangular_solve|ormqr|geqrf|"
               r"householder|kron|cdist|pca|norm|trace|tril|triu|diag|matrix_exp|"
               r"fft\.|stft|istft|signal\.|__rmatmul__|block_diag|cross|vander|"
               r"symeig|eig|lstsq|lobpcg|nn\.functional\.bilinear)"),
    ("nn", r"^(nn\.|_softmax|softmax|log_softmax|_log_softmax|native_layer_norm|"
           r"native_batch_norm|_native_batch_norm|batch_norm|layer_norm|group_norm|"
           r"conv|max_pool|avg_pool|special\.|logsumexp|ctc|_batch_norm|binary_cross|"
           r"cross_entropy|nll|torch\.ops\.aten\._)"),
    ("reduce", r"^(sum|prod|mean|nanmean|std|var|amax|amin|max|min|argmax|argmin|all|any|"
               r"count_nonzero|cumsum|cumprod|cummax|cummin|logcumsumexp|aminmax|median|"
               r"nanmedian|mode|kthvalue|quantile|nanquantile|nansum|norm|var_mean|"
               r"std_mean|_foreach_norm|_foreach_max|masked\.|histc|histogram|bincount|"
               r"unique|cov|corrcoef|renorm|dist|equal|allclose|isclose)"),
    ("index", r"(index|gather|scatter|take|put|masked_|where|nonzero|sort|argsort|topk|"
              r"searchsorted|bucketize|cat|stack|hstack|vstack|dstack|column_stack|"
              r"row_stack|concat|split|chunk|unbind|narrow|select|slice|roll|rot90|flip|"
              r"repeat|tile|pad|constant_pad|embedding|one_hot|unique|combinations|"
              r"cartesian|meshgrid|tril_indices|triu_indices|arange|linspace|logspace|"
              r"full|zeros|ones|eye|diag_embed|diagonal_scatter|fill|clone|"
              r"resize|new_|_foreach_copy|copy)"),
    ("view-or-adapter", r"^(view|reshape|as_strided|expand|permute|transpose|t$|T$|mT|mH|H$|"
                        r"squeeze|unsqueeze|flatten|unflatten|movedim|moveaxis|swap|"
                        r"contiguous|to$|to_sparse|item|tolist|type_as|real|imag|conj|"
                        r"resolve|view_as|alias|atleast|broadcast|ravel|unfold|diagonal|"
                        r"numpy_|__getitem__|__setitem__|split_with|tensor_split|"
                        r"byte|char|short|int|long|half|bfloat16|float|double|bool|cfloat|"
                        r"cdouble|chalf|storage|new_|zero_|fill_|empty)"),
]


def family(op_key):
    name = op_key.split(".")[0] if not op_key.startswith(("nn.", "linalg.", "fft.", "special.",
                                                           "masked.", "signal.", "torch.",
                                                           "sparse.")) else op_key
    # sparse and view-or-adapter first: their names would match other families' patterns
    first = ("sparse", "view-or-adapter")
    for fam, pat in sorted(FAMILIES, key=lambda f: f[0] not in first):
        if re.search(pat, name):
            return fam
    return "elementwise"


def summarize(recs):
    """Latest record per sample -> per op/dtype/variant tallies."""
    latest = {}
    for r in recs:
        latest[(r["op"], r["dtype"], r["variant"], r["i"])] = r
    return latest


def render(results_path, doc_path, sample_desc, models=True):
    recs = summarize(load_results(results_path))
    ops = oi.load_ops()
    per = collections.defaultdict(lambda: collections.Counter())      # (op, dtype)->status
    per_var = collections.defaultdict(lambda: collections.Counter())  # (dtype, variant)
    path = collections.defaultdict(collections.Counter)               # op -> native/fallback
    fb_ops = collections.defaultdict(collections.Counter)             # op -> aten fallbacks
    fb_where = collections.defaultdict(set)                           # op -> variant/dtype
    reasons = collections.defaultdict(collections.Counter)            # op -> reasons
    skips = collections.Counter()
    judged = collections.Counter()  # passes by a second criterion
    totals = collections.defaultdict(collections.Counter)
    for (op, dt, var, i), r in recs.items():
        st = r["status"]
        if i in (-2, -3):
            continue
        if st == "skip":
            skips[(op, r["kind"], r["reason"][:160])] += 1
            continue
        per[(op, dt)][st] += 1
        per_var[(dt, var)][st] += 1
        totals[dt][st] += 1
        if st in oi.PASS:
            path[op][st] += 1
            judged[r["kind"]] += r["kind"] in ("wider_reference", "within_cpu_error", "ties")
        for k, v in r.get("fallback", {}).items():
            fb_ops[op][k] += 1
            fb_where[op].add(f"{var}/{SHORT[dt]}")
        if st == "fail":
            reasons[op][(r["kind"], _norm_reason(r["reason"]))] += 1
            reasons[op][("@variants", f"{var}/{SHORT[dt]}")] += 0
    calls, fallbacks = measure_models() if models else ({}, {})
    model_calls = collections.Counter()
    for c in calls.values():
        for k, v in c.items():
            model_calls[_base(k)] += v
    models_using = collections.defaultdict(set)
    for m, c in calls.items():
        for k in c:
            models_using[_base(k)].add(m)

    def rate(c):
        n = sum(c.values())
        return (100.0 * (c["native"] + c["fallback"]) / n) if n else None

    lines = []
    w = lines.append
    today = datetime.date.today().isoformat()
    w("# Op conformance (OpInfo) on tpu")
    w("")
    w(f"Generated by `python -m torchtpu.ops_report` on {today} with torch "
      f"{torch.__version__} ({sample_desc}). Every OpInfo sample of PyTorch's own op "
      "databases (`op_db`, incl. linalg/fft/special/masked/signal, and the foreach dbs) "
      "runs on tpu and on CPU for each supported dtype of f32, bf16, f16, f64, i64, i32, "
      "bool: the plain op, its in-place and `out=` variants, the backward "
      "(`torch.autograd.grad`, float dtypes), OpInfo's `error_inputs` (same exception "
      "type), and, in float32, `out=` tensors of float64, float16 and int64 on the first "
      "two samples (`out_dtype`: raise where CPU raises, else CPU's values). A sample *passes natively* when it matches CPU within `tests/tolerances.py` "
      "and no op went through the CPU fallback; *via fallback* when it matches but some op "
      "ran on the CPU fallback. Random ops compare shape and dtype only. A float sample "
      "that differs from CPU's result passes if it matches CPU's result one precision up "
      f"rounded to the dtype ({judged['wider_reference']} samples: CPU's low-precision "
      "kernels round intermediates), or, failing that, if its largest error against that "
      "wider result is at most twice CPU's own plus the dtype's atol, as the model "
      f"validation's float64 re-check ({judged['within_cpu_error']} samples: sums in another "
      "order, where CPU's result is no closer to the exact one); sort, argsort, topk and msort, whose indices PyTorch "
      "defines only up to the order of equal elements, pass with another correct answer "
      f"({judged['ties']} samples: values equal, indices distinct and pointing at them, "
      "gradients equal up to a permutation among equal inputs). out= tensors start as the "
      "same NaN/7 pattern on both devices. Skips and "
      "expected failures, each with its reason, are in `tests/opinfo/tables.py`; the raw "
      "per-sample results (with the failure reason of each sample) are in "
      f"`{os.path.relpath(results_path, ROOT)}`.")
    w("")
    w("## Totals")
    w("")
    w("| dtype | samples | pass | native | via fallback | fail |")
    w("|---|---:|---:|---:|---:|---:|")
    allc = collections.Counter()
    for dt in DTYPE_ORDER:
        c = totals.get(dt)
        if not c:
            continue
        allc.update(c)
        n = sum(c.values())
        w(f"| {dt} | {n} | {rate(c):.1f}% | {c['native']} | {c['fallback']} | {c['fail']} |")
    n = sum(allc.values())
    if n:
        w(f"| **all** | {n} | {rate(allc):.1f}% | {allc['native']} | {allc['fallback']} | "
          f"{allc['fail']} |")
    w("")
    w("Per variant (pass % / samples):")
    w("")
    variants = list(oi.VARIANTS + oi.EXTRA_VARIANTS)
    w("| dtype | " + " | ".join(variants) + " |")
    w("|---|" + "---:|" * len(variants))
    for dt in DTYPE_ORDER:
        cells = []
        for v in variants:
            c = per_var.get((dt, v))
            cells.append(f"{rate(c):.1f}% / {sum(c.values())}" if c else "")
        if any(cells):
            w(f"| {dt} | " + " | ".join(cells) + " |")
    w("")
    # fallback ops
    w("## Ops on the CPU fallback, by how often real models call them")
    w("")
    w("Model frequency: aten calls of one training step (forward, backward, AdamW) of tiny "
      "inline GPT-2, Llama, BERT, T5, ViT, ResNet and ConvNeXt models "
      "(`torchtpu/ops_report.py: _tiny_models`), counted on CPU. First, the ops that "
      "those models themselves sent through the tpu fallback:")
    w("")
    model_fb = collections.Counter()
    model_fb_who = collections.defaultdict(set)
    for m, fb in fallbacks.items():
        for k, v in fb.items():
            model_fb[k] += v
            model_fb_who[k].add(m)
    if model_fb:
        w("| aten op (fallback) | calls in the models | models |")
        w("|---|---:|---|")
        for k, v in model_fb.most_common():
            w(f"| `{k}` | {v} | {', '.join(sorted(model_fb_who[k]))} |")
    elif not models:
        w("(Not measured: rendered with --no-models.)")
    else:
        w("None: every op of the tiny models ran natively.")
    w("")
    w("OpInfo ops whose passing samples went (partly) through the fallback, ordered by "
      "the models' call count of the aten ops that fell back (then by OpInfo samples):")
    w("")
    fb_rows = []
    for op in sorted(ops):
        if not fb_ops.get(op):
            continue
        atens = fb_ops[op]
        weight = sum(model_calls.get(_base(a), 0) for a in atens)
        users = set().union(*[models_using.get(_base(a), set()) for a in atens])
        fb_rows.append((-weight, -sum(atens.values()), op, atens, users))
    fb_rows.sort()
    w("| OpInfo op | path | model calls | models | aten ops on the fallback (samples) | "
      "where (variant/dtype) |")
    w("|---|---|---:|---|---|---|")
    for negw, _, op, atens, users in fb_rows:
        p = _path(path.get(op, {}))
        at = ", ".join(f"`{a.split('::')[-1]}` ({c})" for a, c in atens.most_common(4))
        if len(atens) > 4:
            at += f", +{len(atens) - 4}"
        where = sorted(fb_where[op])
        wh = ", ".join(where[:6]) + (f", +{len(where) - 6}" if len(where) > 6 else "")
        w(f"| `{op}` | {p} | {-negw} | {', '.join(sorted(users))} | {at} | {wh} |")
    w("")
    # failures by family
    w("## Failures by family")
    w("")
    w("Most frequent failure reasons per op (kind: reason, sample count), grouped by "
      "family. `kind` is one of value, dtype, shape, device, type, exception (tpu raised, "
      "CPU did not), wrong_exception, no_exception (CPU raised, tpu did not), timeout, "
      "crash.")
    w("")
    fam_ops = collections.defaultdict(list)
    for op in sorted(reasons):
        nfail = sum(v for k, v in reasons[op].items() if k[0] != "@variants")
        fam_ops[family(op)].append((-nfail, op))
    for fam in ["elementwise"] + [f for f, _ in FAMILIES]:
        rows = sorted(fam_ops.get(fam, []))
        if not rows:
            continue
        w(f"### {fam} ({len(rows)} ops, {-sum(r[0] for r in rows)} failing samples)")
        w("")
        w("| op | failing | where (variant/dtype) | top reasons |")
        w("|---|---:|---|---|")
        for negn, op in rows:
            rs = [(k, v) for k, v in reasons[op].most_common() if k[0] != "@variants"]
            where = sorted({k[1] for k in reasons[op] if k[0] == "@variants"})
            top = "; ".join(f"{k[0]}: {_md(k[1])} ({v})" for k, v in rs[:3])
            w(f"| `{op}` | {-negn} | {', '.join(where[:8])}{' …' if len(where) > 8 else ''}"
              f" | {top} |")
        w("")
    # per op table
    w("## Per op")
    w("")
    w("Path: native (every passing sample ran natively), fallback (every one used the CPU "
      "fallback), mixed, or — (nothing passed). Cells: pass % of the op's samples in that "
      "dtype (all variants); empty where OpInfo does not support the dtype on CPU.")
    w("")
    w("| op | family | path | " + " | ".join(SHORT[d] for d in DTYPE_ORDER) + " |")
    w("|---|---|---|" + "---:|" * len(DTYPE_ORDER))
    for op in sorted(ops):
        cells = []
        for dt in DTYPE_ORDER:
            c = per.get((op, dt))
            cells.append(f"{rate(c):.0f}" if c else "")
        if not any(cells):
            continue
        w(f"| `{op}` | {family(op)} | {_path(path.get(op, {}))} | " + " | ".join(cells) + " |")
    w("")
    w("## Skipped")
    w("")
    w("Table skips (`tests/opinfo/tables.py`) and samples CPU itself could not produce:")
    w("")
    agg = collections.Counter()
    for (op, kind, reason), v in skips.items():
        agg[(kind, _norm_reason(reason))] += v
    w("| kind | reason | samples/units |")
    w("|---|---|---:|")
    for (kind, reason), v in agg.most_common(40):
        w(f"| {kind} | {_md(reason)} | {v} |")
    w("")
    doc_path.write_text("\n".join(lines))
    return totals


def _path(c):
    if c.get("native") and c.get("fallback"):
        return "mixed"
    if c.get("fallback"):
        return "fallback"
    if c.get("native"):
        return "native"
    return "—"


def _norm_reason(s):
    s = re.sub(r"0x[0-9a-f]+", "0x…", s)
    s = re.sub(r"max abs err [^,]+, max rel err [^ ,(]+", "max abs err …", s)
    s = re.sub(r"\d+/\d+ elements", "N elements", s)
    s = re.sub(r"\(\w+, \d+ elements\)", "", s)
    s = re.sub(r"out\[[^:]*\]:", "", s)
    s = re.sub(r"\b\d+\b", "N", s)
    return s.strip()[:160]


def _md(s):
    return s.replace("|", "\\|").replace("\n", " ")


# ----------------------------------------------------------------------------- xfails

def write_xfails(results_path, limit_note=""):
    """Regenerates the EXPECTED_FAILURES block of tests/opinfo/tables.py from results."""
    recs = summarize(load_results(results_path))
    fails = collections.defaultdict(dict)
    crashes = {}
    for (op, dt, var, i), r in sorted(recs.items(), key=lambda kv: str(kv[0])):
        if r["status"] != "fail":
            continue
        if r["kind"] in ("crash", "timeout"):
            crashes[(op, dt, var)] = f"{r['kind']}: {r['reason']} (sample {i})"
            continue
        fails[(op, dt, var)][i] = f"{r['kind']}: {r['reason']}"
    p = ROOT / "tests" / "opinfo" / "tables.py"
    text = p.read_text()
    body = ["# >>> EXPECTED_FAILURES (generated by ops_report --write-xfails; edit by "
            "removing entries)",
            "# (op, dtype, variant) -> (reason of the first failing sample, failing sample "
            "indices)",
            "# the machine class of the sweep (_opinfo.machine_class()): listed samples that",
            "# pass are an error only on this class",
            f"EXPECTED_FAILURES_MACHINE = {oi.machine_class()!r}",
            "EXPECTED_FAILURES = {"]
    for k in sorted(fails):
        idx = sorted(fails[k])
        reason = fails[k][idx[0]][:150]
        body.append(f"    {k!r}: ({reason!r}, {tuple(idx)!r}),")
    body.append("}")
    body.append("# Samples that crash the process or hang: skipped in pytest.")
    body.append("CRASHES = {")
    for k in sorted(crashes):
        body.append(f"    {k!r}: {crashes[k][:150]!r},")
    body.append("}")
    body.append("# <<< EXPECTED_FAILURES")
    new = re.sub(r"# >>> EXPECTED_FAILURES.*# <<< EXPECTED_FAILURES", "\n".join(body),
                 text, flags=re.S)
    p.write_text(new)
    return len(fails), len(crashes)


# ----------------------------------------------------------------------------- main

def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m torchtpu.ops_report",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--shard", type=parse_shard, default=(0, 1), help="i/n: run shard i of n")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--dtypes", nargs="+", choices=list(oi.DTYPES))
    ap.add_argument("--ops", nargs="+", help="OpInfo names or keys")
    ap.add_argument("--limit", type=int, help="first N samples per op/dtype/variant")
    ap.add_argument("--sample", choices=["full", "ci"], default="full",
                    help="ci: the pytest CI sample (CI dtypes, first CI_SAMPLES samples)")
    ap.add_argument("--budget", type=float, default=None, help="seconds per sample")
    ap.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    ap.add_argument("--doc", type=Path, default=DEFAULT_DOC)
    ap.add_argument("--fresh", action="store_true", help="discard earlier results")
    ap.add_argument("--redo", action="store_true",
                    help="discard earlier results of the selected ops/dtypes, then run them")
    ap.add_argument("--render-only", action="store_true")
    ap.add_argument("--no-render", action="store_true")
    ap.add_argument("--no-models", action="store_true",
                    help="render without running the tiny models (no frequency order)")
    ap.add_argument("--write-xfails", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--job", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--state", help=argparse.SUPPRESS)
    ap.add_argument("--start-unit", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    tab = oi.tables()
    if args.budget is None:
        args.budget = float(getattr(tab, "SAMPLE_TIMEOUT_S", 60))
    if args.sample == "ci":
        args.dtypes = args.dtypes or list(tab.CI_DTYPES)
        args.limit = args.limit if args.limit is not None else tab.CI_SAMPLES
    if args.worker:
        import torchtpu
        torchtpu.set_fallback("allow")
        import warnings
        warnings.simplefilter("ignore")
        worker(args)
        return 0
    if not args.render_only:
        sweep(args)
    desc = ("full sweep" if args.sample == "full" and args.limit is None else
            f"sample: {args.sample}, limit {args.limit}")
    if not args.no_render:
        totals = render(args.results, args.doc, desc, models=not args.no_models)
        for dt in ("float32", "bfloat16"):
            c = totals.get(dt)
            if c:
                n = sum(c.values())
                print(f"{dt}: {100 * (c['native'] + c['fallback']) / n:.1f}% of {n} samples "
                      f"pass ({c['native']} native, {c['fallback']} via fallback, "
                      f"{c['fail']} fail)")
        print(f"wrote {args.doc}")
    if args.write_xfails:
        nf, nc = write_xfails(args.results)
        print(f"tests/opinfo/tables.py: {nf} expected-failure entries, {nc} crash skips")
    return 0


if __name__ == "__main__":
    sys.exit(main())
