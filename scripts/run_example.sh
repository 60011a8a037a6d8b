#!/usr/bin/env bash
# The main job: sets everything up on a fresh machine, then trains the GPT example on
# the tpu device, printing loss and tokens/s. Extra arguments go to the example.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$(bash "$root/scripts/setup.sh" | tail -n 1)"
exec "$venv/bin/python" "$root/examples/train_gpt.py" "$@"
