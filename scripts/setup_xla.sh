#!/usr/bin/env bash
# Optional: creates (once per machine) a separate virtual environment with PyTorch/XLA,
# which needs its own torch, for the benchmark suite's "cpu (pytorch/xla)" rows
# (bench/xla_gpt.py, run with PJRT_DEVICE=CPU). Nothing else depends on it.
#
# Pins (scripts/requirements-xla.txt): torch==2.9.0 + torch_xla==2.9.0 for Python 3.11.
# The venv sits outside the checkout, keyed by the hash of that file, like scripts/env.sh
# does for the main venv; torchtpu.bench computes the same path. Safe to run repeatedly;
# prints the venv path on its last line.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
req="$root/scripts/requirements-xla.txt"
hash="$(sha256sum "$req" | cut -c1-16)"
venv="${TORCHTPU_XLA_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/torchtpu/xla-venv-$hash}"
if [ ! -f "$venv/.complete" ]; then
  echo "setup_xla: creating $venv (torch + torch_xla, several GB)"
  rm -rf "$venv"
  python3.11 -m venv "$venv" 2>/dev/null || python3 -m venv "$venv"
  # PyTorch's CPU-only wheels are far smaller than PyPI's CUDA build; use them when the
  # index answers, else PyPI (the CUDA build runs on CPU as well, it is only larger).
  extra=()
  if curl -fsS --max-time 10 -o /dev/null https://download.pytorch.org/whl/cpu/torch/ 2>/dev/null; then
    extra=(--extra-index-url https://download.pytorch.org/whl/cpu)
  fi
  "$venv/bin/pip" install -q "${extra[@]}" -r "$req"
  PJRT_DEVICE=CPU "$venv/bin/python" -c \
    "import torch, torch_xla; print('setup_xla: torch', torch.__version__, 'torch_xla', torch_xla.__version__)"
  touch "$venv/.complete"
fi
echo "$venv"
