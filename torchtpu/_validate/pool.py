"""A pool of worker subprocesses, each running one model at a time under a timeout.

A worker that hangs past the timeout or dies (segfault, OOM kill) is killed by its pid and
replaced; its model is recorded as `timeout` / `exception (worker died)`. Workers are
recycled after `recycle` models so leaks cannot accumulate."""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time

from .runner import MODES


class Worker:
    def __init__(self, env, log):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import torch; from torchtpu._validate.worker import main; main()"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=log, env=env, bufsize=0)
        self.buf = b""
        self.ready = False
        self.req = None
        self.started = None
        self.done = 0

    def fileno(self):
        return self.proc.stdout.fileno()

    def send(self, req):
        self.req, self.started = req, time.time()
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        self.proc.stdin.flush()

    def read_lines(self):
        try:
            chunk = os.read(self.fileno(), 1 << 20)
        except OSError:
            chunk = b""
        if not chunk:
            return None  # EOF: the worker died
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        return [json.loads(x) for x in lines if x.strip()]

    def kill(self):
        try:
            os.kill(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=10)
        except Exception:
            pass

    def close(self):
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=20)
        except Exception:
            self.kill()


def run_pool(ids, on_result, workers=1, timeout=360.0, modes=MODES, train_ids=(),
             recycle=60, log=None, threads=1):
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env["TORCHTPU_VALIDATE_THREADS"] = str(threads)
    env["TORCHTPU_VALIDATE_TIMEOUT"] = str(timeout)  # the runner's re-check budget
    env.setdefault("OMP_NUM_THREADS", str(threads))
    env.setdefault("TORCHTPU_FALLBACK", "allow")
    logf = open(log, "a") if log else subprocess.DEVNULL
    pending = list(ids)[::-1]
    train_ids = set(train_ids)
    pool = [Worker(env, logf) for _ in range(min(workers, len(pending)) or 1)]
    startup = 300.0
    born = {id(w): time.time() for w in pool}

    def replace(w):
        w.kill()
        nw = Worker(env, logf)
        born[id(nw)] = time.time()
        pool[pool.index(w)] = nw
        return nw

    try:
        while pending or any(w.req for w in pool):
            for w in pool:
                if w.ready and w.req is None and pending:
                    mid = pending.pop()
                    w.send({"id": mid, "modes": list(modes), "train": mid in train_ids})
            r, _, _ = select.select(pool, [], [], 1.0)
            for w in list(r):
                lines = w.read_lines()
                if lines is None:  # died
                    if w.req:
                        on_result(_dead(w.req, w.proc.poll(), time.time() - w.started))
                    elif not w.ready:
                        raise RuntimeError("validation worker failed to start (see --log)")
                    replace(w)
                    continue
                for msg in lines:
                    if msg.get("ready"):
                        w.ready = True
                        continue
                    on_result(msg)
                    w.req = None
                    w.done += 1
                if w.req is None and w.done >= recycle:
                    w.close()
                    replace(w)
            now = time.time()
            for w in list(pool):
                if w.req and now - w.started > timeout:
                    on_result(_timeout(w.req, now - w.started))
                    replace(w)
                elif not w.ready and now - born[id(w)] > startup:
                    raise RuntimeError("validation worker did not start within 300 s")
    finally:
        for w in pool:
            if w.req:
                w.kill()
            else:
                w.close()
        if log:
            logf.close()


def _timeout(req, secs):
    m = {"status": "fail", "cause": "timeout", "detail": f"no result within {secs:.0f} s "
         "(the whole model: build, CPU reference and every mode)", "fallback_ops": {}}
    return {"id": req["id"], "source": _source(req["id"]), "status": "fail", "timeout": True,
            "modes": {mode: dict(m) for mode in req["modes"]}, "train": None}


def _dead(req, rc, secs):
    m = {"status": "fail", "cause": "exception", "op": None,
         "detail": f"worker process died (exit status {rc}) after {secs:.0f} s", "fallback_ops": {}}
    return {"id": req["id"], "source": _source(req["id"]), "status": "fail", "crashed": True,
            "modes": {mode: dict(m) for mode in req["modes"]}, "train": None}


def _source(model_id):
    return {"hf": "transformers", "timm": "timm", "tv": "torchvision"}[model_id.split("/")[0]]
