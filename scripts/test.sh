#!/usr/bin/env bash
# The test command: sets everything up on a fresh machine (venv, pinned installs,
# build), then runs the C tests and the pytest suite.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$(bash "$root/scripts/setup.sh" | tail -n 1)"
cd "$root"
echo "== C tests (libtpurt, no PyTorch)"
make -s -C runtime test OPENBLAS_INC="$("$venv/bin/python" -c 'import scipy_openblas32 as s; print(s.get_include_dir())')" \
  OPENBLAS_LIB="$("$venv/bin/python" -c 'import scipy_openblas32 as s; print(s.get_lib_dir())')"
echo "== pytest"
"$venv/bin/python" -m pytest -q -p no:cacheprovider tests "$@"
