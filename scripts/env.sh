# Sourced by the setup and test scripts: where the project's virtual environment lives.
# The venv sits outside the checkout, keyed by the hash of requirements.txt, so a fresh
# clone reuses an existing install and a changed pin makes a new one.
_tt_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_tt_hash="$(sha256sum "$_tt_root/requirements.txt" | cut -c1-16)"
export TORCHTPU_VENV="${TORCHTPU_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/torchtpu/venv-$_tt_hash}"
