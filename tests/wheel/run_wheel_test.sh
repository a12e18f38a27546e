#!/usr/bin/env bash
# The wheel works outside the source tree: build it from BUILD_DIR, install it
# into a fresh venv (no index, no build tree on any path), and run a kernel on
# the CPU emulator from another directory, against a float64 reference. The
# library and the LLVM plugin must both come from the installed package.
#   tests/wheel/run_wheel_test.sh BUILD_DIR WORK_DIR [PYTHON]
# PYTHON (default python3) makes the venv; it must have NumPy.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$1
work=$2
python=${3:-python3}
rm -rf "$work"
mkdir -p "$work"
FLASHJIT_BUILD_DIR=$build "$src/scripts/build-wheel.sh" "$work/dist"
wheel=$(ls "$work"/dist/flashjit-*.whl)
# NumPy from Debian's python3-numpy: the venv sees the system's site-packages.
"$python" -m venv --system-site-packages "$work/venv"
"$work/venv/bin/pip" install --quiet --no-index --no-deps --no-cache-dir "$wheel"
cd "$work"
env -u FLASHJIT_LIBRARY -u FLASHJIT_LLVM_PLUGIN -u PYTHONPATH \
  FLASHJIT_CACHE_DIR="$work/cache" "$work/venv/bin/python" - "$work/venv" <<'PY'
import pathlib, sys
import numpy as np
import flashjit
from flashjit import _lib

venv = pathlib.Path(sys.argv[1]).resolve()
package = pathlib.Path(flashjit.__file__).resolve().parent
assert venv in package.parents, f"flashjit imported from {package}, not from the venv"
assert pathlib.Path(_lib.lib._name).resolve().parent == package, _lib.lib._name

# Fresh random inputs, the output poisoned by the package; bf16 tolerance 3e-2.
rng = np.random.default_rng()
b, s, h, d = 1, 37, 2, 72
def bf16(x):
    bits = x.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).view(np.float32)
q, k, v = (bf16(rng.uniform(-1, 1, (b, s, h, d))) for _ in range(3))
out = flashjit.flash_attn_func(q, k, v, causal=True, arch="gfx1201")
qd, kd, vd = (x.astype(np.float64).transpose(0, 2, 1, 3) for x in (q, k, v))
scores = qd @ kd.transpose(0, 1, 3, 2) / np.sqrt(d)
scores[..., np.triu(np.ones((s, s), bool), 1)] = -np.inf
p = np.exp(scores - scores.max(-1, keepdims=True))
ref = ((p / p.sum(-1, keepdims=True)) @ vd).transpose(0, 2, 1, 3)
err = np.abs(np.asarray(out, np.float64) - ref).max()
assert np.isfinite(err) and err <= 3e-2, f"max abs error {err} > 3e-2"

# The emulator's compiler is the plugin inside the package.
maps = pathlib.Path("/proc/self/maps").read_text()
plugins = {line.split()[-1] for line in maps.splitlines() if "libflashjit_llvm.so" in line}
assert plugins == {str(package / "libflashjit_llvm.so")}, plugins
print(f"wheel ok: {package}, max abs error {err:.3e}")
PY
