#!/usr/bin/env bash
# A venv for running CleanRL's own PPO scripts beside ours (bench/bench_ppo.py
# --cleanrl DIR): <repo>/.venv-cleanrl, with CleanRL's pins where they set the
# behaviour (gymnasium 0.29.1: its scripts use that API, e.g. TransformObservation
# without an observation space; mujoco 2.3.3, its pin for the MuJoCo envs), our torch
# (2.13.0, the CPU wheel on this disk, as every venv here), tyro and tensorboard (its
# scripts import both).  CleanRL's scripts are not on PyPI in their current form
# (the `cleanrl` package there is 0.4.8 of 2021): pass a checkout of
# github.com/vwxyzjn/cleanrl (its cleanrl/ folder) to bench_ppo.py --cleanrl.
#
#   bash bench/install_cleanrl.sh          # idempotent; a re-run takes a second
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=.venv-cleanrl
PYTHON=${PYTHON:-python3}
STAMP="$VENV/.installed"
PINS=(
  "torch==2.13.0"
  "gymnasium==0.29.1"
  "mujoco==2.3.3"
  "numpy==1.26.4"        # gymnasium 0.29.1 uses np.bool8, gone in numpy 2
  "tyro==1.0.17"
  "tensorboard==2.21.0"
  "imageio==2.38.2"      # gymnasium's MuJoCo envs import it
)
WANT="$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)"
if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  echo "install_cleanrl: $VENV is up to date"
  exit 0
fi
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
rm -f "$STAMP"
"$VENV/bin/python" -m pip install --disable-pip-version-check -q "${PINS[@]}" \
  2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
"$VENV/bin/python" -c "import torch, gymnasium, mujoco, tyro, torch.utils.tensorboard
gymnasium.make('Hopper-v4').reset(seed=0)
print('install_cleanrl: torch', torch.__version__, 'gymnasium', gymnasium.__version__,
      'mujoco', mujoco.__version__)"
echo "$WANT" > "$STAMP"
