#!/usr/bin/env bash
# A venv for running CleanRL's own PPO scripts beside ours (bench/bench_ppo.py
# --cleanrl DIR): <repo>/.venv-cleanrl, with CleanRL's pins where they set the
# behaviour (gymnasium 0.29.1: its scripts use that API, e.g. TransformObservation
# without an observation space, FrameStack, GrayScaleObservation; mujoco 2.3.3, its pin
# for the MuJoCo envs), our torch (2.13.0, the CPU wheel on this disk, as every venv
# here), tyro and tensorboard (its scripts import both).  CleanRL's scripts are not on
# PyPI in their current form (the `cleanrl` package there is 0.4.8 of 2021): pass a
# checkout of github.com/vwxyzjn/cleanrl to bench_ppo.py --cleanrl, its cleanrl/ folder
# with cleanrl_utils/ beside it (ppo_atari.py imports cleanrl_utils.atari_wrappers):
#
#   git clone https://github.com/vwxyzjn/cleanrl ~/cleanrl   # or, from a bare copy:
#   git --git-dir=REPO.git archive HEAD cleanrl cleanrl_utils | tar -x -C ~/cleanrl
#
# Atari (ppo_atari.py): CleanRL pins ale-py 0.8.1, whose ROMs come from AutoROM, a
# download outside PyPI.  ale-py 0.10.2 is the newest release that bundles the ROMs
# and runs with gymnasium 0.29.1 (tried: 0.9.1 and 0.10.2 step PongNoFrameskip-v4
# there; 0.11.2 fails to import, wanting gymnasium 1.x's AutoresetMode; 0.12.1 imports
# but registers no id).  It registers its ids (PongNoFrameskip-v4, ALE/Pong-v5, ...)
# when imported, not by gymnasium 0.29's plugin entry point as 0.8.1 did, and
# ppo_atari.py never imports it, so a .pth file here imports ale_py at every start of
# this venv's python.
# opencv-python-headless 4.11.0.86 (<5 as CleanRL's pin; a wheel for numpy 1.26):
# gymnasium 0.29's ResizeObservation and GrayScaleObservation need cv2.
# Stable-Baselines3 is not needed: ppo_atari.py's wrappers are cleanrl_utils' own copy.
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
  "ale-py==0.10.2"       # Atari, ROMs bundled (above)
  "opencv-python-headless==4.11.0.86"
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
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "import ale_py" > "$SITE/ale_py_register.pth"     # registers the Atari ids
"$VENV/bin/python" -c "import torch, gymnasium, mujoco, tyro, torch.utils.tensorboard, cv2
import ale_py
gymnasium.make('Hopper-v4').reset(seed=0)
env = gymnasium.make('PongNoFrameskip-v4')
env = gymnasium.wrappers.GrayScaleObservation(gymnasium.wrappers.ResizeObservation(env, (84, 84)))
env.reset(seed=0)
assert env.step(0)[0].shape == (84, 84)
print('install_cleanrl: torch', torch.__version__, 'gymnasium', gymnasium.__version__,
      'mujoco', mujoco.__version__, 'ale-py', ale_py.__version__, 'cv2', cv2.__version__)"
echo "$WANT" > "$STAMP"
