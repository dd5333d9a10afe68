#!/usr/bin/env bash
# Rebuild torchrl's C++ extension (its segment trees, which PrioritizedSampler needs)
# against the torch installed in the venv of PYTHON, when the shipped one does not load.
#
#   bash bench/torchrl_extension.sh .venv/bin/python
#
# Why: every torchrl wheel on PyPI (0.11.1 .. 0.14.1 were tried) ships
# torchrl/_torchrl*.so built against another torch release; with torch 2.13.0 it
# fails to load ("undefined symbol: torch::autograd::_wrap_outputs ..."), and torchrl
# has no sdist. The wheel does ship the extension's C++ sources (torchrl/csrc), so
# this builds them against the installed torch (needs g++ and Python headers; 45 s on
# 2 cores with ninja, Debian's ninja-build, 1.5 min without) and puts the result in
# place of the shipped .so (kept beside it as _torchrl.so.orig-wheel). Used by `make install` (the test venv: the
# integration benchmark's peer) and bench/install_peers.sh (.venv-peers).
# Exits 0 when the extension loads afterwards, 1 otherwise.
set -euo pipefail
VPY=${1:?usage: torchrl_extension.sh PYTHON}
VPY="$(cd "$(dirname "$VPY")" && pwd)/$(basename "$VPY")"   # absolute: the build runs elsewhere
if "$VPY" -c "import torch, torchrl._torchrl" >/dev/null 2>&1; then
  exit 0
fi
echo "torchrl_extension: the shipped C++ extension does not load with this torch; rebuilding it from torchrl/csrc"
TRDIR=$("$VPY" -c "import importlib.util as u, os; print(os.path.dirname(u.find_spec('torchrl').origin))")
BUILD=$(mktemp -d)
trap 'rm -rf "$BUILD"' EXIT
cat >"$BUILD/setup.py" <<'PY'
import os
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

src = os.environ["TORCHRL_CSRC"]
setup(
    name="torchrl-extension-rebuild",
    ext_modules=[
        CppExtension(
            "_torchrl",
            [os.path.join(src, "pybind.cpp"), os.path.join(src, "utils.cpp")],
            extra_compile_args=["-O3", "-g0", "-Wno-comment"],
        )
    ],
    # ninja compiles both files at once (MAX_JOBS); without it torch falls back to the
    # one-at-a-time backend, with a warning.
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
PY
if (cd "$BUILD" && MAX_JOBS="${MAX_JOBS:-$(nproc)}" TORCHRL_CSRC="$TRDIR/csrc" \
        "$VPY" setup.py -q build_ext --inplace >build.log 2>&1); then
  SO=$(basename "$(ls "$TRDIR"/_torchrl*.so | head -n1)")
  [[ -f "$TRDIR/_torchrl.so.orig-wheel" ]] || cp "$TRDIR/$SO" "$TRDIR/_torchrl.so.orig-wheel"
  cp "$BUILD"/_torchrl*.so "$TRDIR/$SO"
else
  echo "torchrl_extension: rebuilding torchrl's extension failed. Log tail:" >&2
  tail -n 30 "$BUILD/build.log" >&2 || true
  exit 1
fi
"$VPY" -c "import torch, torchrl._torchrl" && echo "torchrl_extension: rebuilt; torchrl._torchrl loads"
