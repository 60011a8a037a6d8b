#!/usr/bin/env bash
# Creates (once per machine) the pinned virtual environment, then builds libtpurt and the
# torchtpu extension in place. Safe to run repeatedly; prints the venv path at the end.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/env.sh"
if [ ! -f "$TORCHTPU_VENV/.complete" ]; then
  echo "setup: creating $TORCHTPU_VENV (first run on this machine; torch is large)"
  rm -rf "$TORCHTPU_VENV"
  python3.11 -m venv "$TORCHTPU_VENV" 2>/dev/null || python3 -m venv "$TORCHTPU_VENV"
  "$TORCHTPU_VENV/bin/pip" install -q -r "$root/requirements.txt"
  touch "$TORCHTPU_VENV/.complete"
fi
if [ "${TORCHTPU_SKIP_BUILD:-0}" != 1 ]; then
  "$TORCHTPU_VENV/bin/python" "$root/scripts/build.py"
fi
echo "$TORCHTPU_VENV"
