"""Worker subprocess: reads one JSON request per line on stdin ({"id", "modes", "train"}),
answers one JSON result per line on the protocol pipe (the original stdout). Anything the
models print goes to stderr."""
from __future__ import annotations

import json
import os
import sys
import warnings


def main():
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    warnings.filterwarnings("ignore")
    import torch
    torch.set_num_threads(int(os.environ.get("TORCHTPU_VALIDATE_THREADS", "1")))
    import torchtpu  # noqa: F401
    from . import runner
    try:
        import transformers
        transformers.logging.set_verbosity_error()
    except Exception:
        pass
    proto.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        try:
            res = runner.run_model(req["id"], tuple(req["modes"]), bool(req.get("train")))
        except BaseException as e:  # noqa: BLE001 - the harness itself must answer
            res = {"id": req["id"], "status": "fail", "harness_error": f"{type(e).__name__}: {e}",
                   "modes": {}}
        proto.write(json.dumps(res, default=str) + "\n")
        runner.cleanup()
        if res.get("device_dead"):
            return


if __name__ == "__main__":
    main()
