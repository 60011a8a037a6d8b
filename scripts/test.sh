#!/usr/bin/env bash
# The test command: sets everything up on a fresh machine (venv, pinned installs,
# build), then runs the C tests and the pytest suite in each eager mode.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$(bash "$root/scripts/setup.sh" | tail -n 1)"
cd "$root"
blas() { "$venv/bin/python" -c "import scipy_openblas32 as s; print(s.get_$1_dir())"; }
echo "== C tests (libtpurt, no PyTorch)"
make -s -C runtime test OPENBLAS_INC="$(blas include)" OPENBLAS_LIB="$(blas lib)"
echo "== pytest, defer_and_fuse mode (default)"
"$venv/bin/python" -m pytest -q -p no:cacheprovider tests "$@"
# The same tests in the other eager modes (debug warns on NaN instead of raising: the op
# tests compute NaN and Inf on purpose).
for mode in strict debug; do
  echo "== pytest, $mode mode"
  TORCHTPU_EAGER_MODE=$mode TORCHTPU_DEBUG_NAN=warn \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider tests "$@"
done
