#!/usr/bin/env bash
# Install the peer libraries whose sum trees bench/peer_trees.py times against
# ours: cpprb, torchrl (+ tensordict) and tianshou, and Stable-Baselines3, whose
# DQN bench/peer_sb3.py trains for bench/bench_train.py, into a venv of their
# own, <repo>/.venv-peers (never into the project's .venv).
#
#   bash bench/install_peers.sh            # idempotent; a re-run takes a second
#   PYTHON=python3.11 bash bench/install_peers.sh
#   PEERS_FORCE=1 bash bench/install_peers.sh   # reinstall even if up to date
#
# Versions (all pinned; chosen by `pip index versions`, `pip install --dry-run`
# and the wheels' Requires-Dist metadata, then checked by importing them next
# to torch 2.13.0+cpu on Python 3.11):
#   torch      2.13.0   the project's pin; the CPU wheel in /opt/wheels wins
#                        over PyPI's CUDA build (2.13.0+cpu sorts higher).
#   cpprb      11.0.0   newest; needs only numpy.
#   torchrl    0.14.1   newest; Requires-Dist torch>=2.1, tensordict<0.15,>=0.14.3.
#   tensordict 0.14.3   newest release torchrl 0.14.1 accepts (0.15.x is
#                        excluded by torchrl); its C++ _C module imports fine
#                        with torch 2.13.0.
#   tianshou   2.0.1    newest; Requires-Dist torch>=2.0,<3 (pure Python; its
#                        SegmentTree runs on numba).
#   stable-baselines3 2.9.2  newest; Requires-Dist torch>=2.8,<3,
#                        gymnasium>=0.29.1,<2.0, numpy>=1.20,<3, cloudpickle
#                        (no extras needed: its DQN, callbacks and evaluation
#                        run without pandas/tensorboard).
#   gymnasium  1.4.0     the version in the project's .venv, so both sides step
#                        the same CartPole code (tianshou pulls it in anyway).
#   numpy 2.4.6, numba 0.68.1, llvmlite 0.50.0: what pip resolves today,
#                        pinned because they set the peers' speed.
#   ray        2.60.0    newest; the reactor paper's baseline in bench_lockstep.py
#                        (one actor per environment, one ray.get per round).
#   envpool    1.2.5     newest; its wheel works with numpy 2.4 (CartPole-v1, Pong-v5).
#   ale-py     0.12.1    the project's pin: the Pong ROM and AtariVectorEnv.
#   opencv-python-headless 5.0.0.93  the project's pin (AtariPreprocessing needs it).
#   pettingzoo 1.27.0, magent2 0.3.4, pygame-ce 2.5.8: the project's pins (magent2
#                        requires pygame-ce); the env of bench/bench_multiagent.py, whose
#                        Ray side (peer_ray_multiagent.py) steps it here.  ma-gym (the
#                        reactor paper's TrafficJunction) does not install: it needs
#                        gym<=0.20, which does not build with today's setuptools.
#   mujoco 4.0.1, imageio 2.38.2: the project's pins (requirements-mujoco.txt); SB3's
#                        PPO on Hopper-v4 beside ours (bench_ppo.py --env Hopper-v4).
#
# torchrl caveat: torchrl's shipped C++ extension (its segment trees) does not
# load with torch 2.13.0; bench/torchrl_extension.sh (see there) rebuilds it from
# the C++ sources the wheel ships. If that rebuild fails, torchrl stays installed
# but its trees don't import, and peer_trees.py reports and skips it.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV=.venv-peers
PYTHON=${PYTHON:-python3}
STAMP="$VENV/.peers-installed"

PINS=(
  "torch==2.13.0"
  "cpprb==11.0.0"
  "torchrl==0.14.1"
  "tensordict==0.14.3"
  "tianshou==2.0.1"
  "stable-baselines3==2.9.2"
  "gymnasium==1.4.0"
  "numpy==2.4.6"
  "numba==0.68.1"
  "llvmlite==0.50.0"
  "setuptools==84.2.1"   # for rebuilding torchrl's C++ extension
  "ray==2.60.0"
  "envpool==1.2.5"
  "ale-py==0.12.1"
  "opencv-python-headless==5.0.0.93"
  "pettingzoo==1.27.0"
  "magent2==0.3.4"
  "pygame-ce==2.5.8"
  "mujoco==4.0.1"
  "imageio==2.38.2"
)

# The stamp records a hash of this script, so editing a pin reinstalls.
WANT="$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)"

if [[ -z "${PEERS_FORCE:-}" && -x "$VENV/bin/python" && -f "$STAMP" ]] \
   && [[ "$(head -n1 "$STAMP")" == "$WANT" ]]; then
  echo "install_peers: $VENV is up to date (delete $STAMP or set PEERS_FORCE=1 to redo):"
  tail -n +2 "$STAMP"
  exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "install_peers: creating $VENV with $("$PYTHON" --version 2>&1)"
  "$PYTHON" -m venv "$VENV"
fi
VPY="$PWD/$VENV/bin/python"
rm -f "$STAMP"

echo "install_peers: pip install ${PINS[*]}"
# pip's warnings about local index folders that lack a package are noise.
"$VPY" -m pip install --disable-pip-version-check -q "${PINS[@]}" \
  2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
"$VPY" -m pip check || echo "install_peers: (pip check's complaints above are not fatal)"
for p in "${PINS[@]}"; do
  name=${p%%==*}; ver=${p##*==}
  have=$("$VPY" -c "import importlib.metadata as m; print(m.version('$name'))" 2>/dev/null || echo none)
  if [[ "${have%%+*}" != "$ver" ]]; then
    echo "install_peers: ERROR: $name is '$have', wanted $ver" >&2
    exit 1
  fi
done

# --- torchrl: rebuild the C++ extension against this torch if needed ----------
bash bench/torchrl_extension.sh "$VPY" \
  || echo "install_peers: WARNING: torchrl's extension does not load; torchrl will be skipped" >&2

# --- report --------------------------------------------------------------------
REPORT=$("$VPY" - <<'EOF'
import importlib, importlib.metadata as md, os, sys
os.environ.setdefault("RL_WARNINGS", "0")
print(f"  python {sys.version.split()[0]} at {sys.prefix}")
for dist in ("torch", "numpy", "numba", "cpprb", "tensordict", "torchrl", "tianshou",
             "stable-baselines3", "gymnasium", "ray", "envpool", "ale-py", "pettingzoo",
             "magent2"):
    try:
        ver = md.version(dist)
    except md.PackageNotFoundError:
        ver = "not installed"
    print(f"  {dist:<18}{ver}")
checks = {
    "cpprb": "cpprb:PrioritizedReplayBuffer",
    "torchrl": "torchrl._torchrl:SumSegmentTreeFp32",
    "tianshou": "tianshou.data.utils.segtree:SegmentTree",
    "stable-baselines3": "stable_baselines3:DQN",
    "ray": "ray:remote",
    "envpool": "envpool:make",
    "ale-py": "ale_py.vector_env:AtariVectorEnv",
    "magent2": "magent2.environments.battle_v4:parallel_env",
}
for peer, target in checks.items():
    mod, attr = target.split(":")
    try:
        getattr(importlib.import_module(mod), attr)
        print(f"  import {mod}.{attr}: ok")
    except Exception as exc:  # noqa: BLE001
        print(f"  import {mod}.{attr}: FAILED ({type(exc).__name__}: {str(exc)[:120]})")
EOF
)
echo "install_peers: installed into $VENV:"
echo "$REPORT"
printf '%s\n%s\n' "$WANT" "$REPORT" >"$STAMP"
