"""pal_hpc's K-ary PER plugged into Stable-Baselines3 and torchrl, beside each
framework's own replay, in one run (both frameworks are in .venv: `make install` puts
them there for pal_hpc.integrations' tests, so this runs in .venv, not .venv-peers).

  sb3-dqn   SB3 DQN on CartPole-v1 at rl-baselines3-zoo's settings (those of
            bench/peer_sb3.py): SB3's uniform ReplayBuffer vs pal_hpc.integrations.sb3.DQN
            (alpha 0.6, beta 0.4 -> 1).  Time per gradient step (all of train() over
            the gradient steps it took; target: PER at most 1.15x uniform) and wall time
            to a greedy mean return of 475 (eval every 5,000 steps, as bench_train.py).
  sb3-sac   the same for SAC on Pendulum-v1 at the zoo's settings (those of
            bench/peer_sb3_continuous.py), target -200, eval every 2,000 steps.
  torchrl   a sequential DQN loop of torchrl's own design (sota-implementations/dqn:
            Collector, EGreedyModule, DQNLoss, HardUpdate, TensorDictReplayBuffer over
            LazyTensorStorage(10,000), batch 128, priority_key "td_error") with
            torchrl's PrioritizedSampler vs KSumPrioritizedSampler: end-to-end time per
            env step and per update (target: ours >= 1.3x faster); and sample +
            update_priority alone at capacity 2**20, batch 128 (target: >= 2x).

    python bench/bench_integrations.py           # 5 seeds, to the targets (an hour or more)
    python bench/bench_integrations.py --quick   # 1 seed, short runs: a smoke check
    python bench/bench_integrations.py --only torchrl
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import torch

from peer_sb3 import evaluate as evaluate_discrete
from peer_sb3_continuous import evaluate as evaluate_continuous


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "n/a"


# -- Stable-Baselines3 -----------------------------------------------------------------
def sb3_settings(algo: str, total: int) -> tuple[str, dict]:
    """Environment id and the zoo's hyperparameters (see bench/peer_sb3*.py)."""
    if algo == "dqn":
        return "CartPole-v1", dict(
            learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1_000,
            gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
            exploration_fraction=min(1.0, 8_000 / total), exploration_final_eps=0.04,
            policy_kwargs=dict(net_arch=[256, 256]))
    return "Pendulum-v1", dict(learning_rate=1e-3)


def run_sb3(algo: str, per: bool, seed: int, total: int, target: float, eval_every: int) -> dict:
    """One training run; returns seconds per gradient step and time to target."""
    import gymnasium as gym
    import stable_baselines3 as sb3
    from stable_baselines3.common.callbacks import BaseCallback

    from pal_hpc.integrations import sb3 as ours

    env_id, kw = sb3_settings(algo, total)
    cls = getattr(ours if per else sb3, algo.upper())
    model = cls("MlpPolicy", gym.make(env_id), seed=seed, device="cpu", verbose=0, **kw)
    evaluate = evaluate_discrete if algo == "dqn" else evaluate_continuous
    clock = {"train": 0.0, "eval": 0.0, "hit": None, "best": -np.inf}
    train = model.train

    def timed_train(gradient_steps, batch_size):
        t = time.perf_counter()
        train(gradient_steps=gradient_steps, batch_size=batch_size)
        clock["train"] += time.perf_counter() - t

    model.train = timed_train

    class ToTarget(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps % eval_every:
                return True
            mean = float(np.mean(evaluate(self.model, env_id, 10, seed + 10**6 + self.num_timesteps)))
            clock["best"] = max(clock["best"], mean)
            if mean >= target:
                clock["hit"] = time.perf_counter() - t0
            return clock["hit"] is None

    t0 = time.perf_counter()
    model.learn(total_timesteps=total, callback=ToTarget())
    return {"per_step_ms": 1e3 * clock["train"] / max(model._n_updates, 1),
            "updates": model._n_updates, "to_target_s": clock["hit"], "best": clock["best"],
            "steps": model.num_timesteps, "wall_s": time.perf_counter() - t0}


def bench_sb3(algo: str, seeds: list[int], total: int, target: float, eval_every: int) -> None:
    print(f"\n== SB3 {algo.upper()} ({sb3_settings(algo, total)[0]}, zoo settings, up to {total:,} "
          f"env steps, target {target:g}); uniform = SB3's ReplayBuffer, PER = pal_hpc", flush=True)
    rows = {False: [], True: []}
    for seed in seeds:
        for per in (False, True):   # alternate so load drifts hit both alike
            r = run_sb3(algo, per, seed, total, target, eval_every)
            rows[per].append(r)
            hit = f"{r['to_target_s']:.1f} s" if r["to_target_s"] else "not reached"
            print(f"  seed {seed} {'PER    ' if per else 'uniform'}  {r['per_step_ms']:.3f} ms/grad step "
                  f"({r['updates']:,} steps)  to {target:g}: {hit}  best {r['best']:.1f}", flush=True)
    med = {k: statistics.median(r["per_step_ms"] for r in v) for k, v in rows.items()}
    print(f"  time per gradient step (median over seeds): uniform {med[False]:.3f} ms, "
          f"PER {med[True]:.3f} ms, PER/uniform {ratio(med[True], med[False])} (target <= 1.15x)")
    for per in (False, True):
        times = [r["to_target_s"] if r["to_target_s"] else float("inf") for r in rows[per]]
        print(f"  wall time to {target:g}, {'PER    ' if per else 'uniform'}: median "
              f"{statistics.median(times):.1f} s, runs reaching it {sum(t < float('inf') for t in times)}"
              f"/{len(times)}")


# -- torchrl -----------------------------------------------------------------------------
def make_sampler(kind: str, capacity: int):
    from torchrl.data import PrioritizedSampler

    from pal_hpc.integrations.torchrl import KSumPrioritizedSampler
    cls = PrioritizedSampler if kind == "torchrl" else KSumPrioritizedSampler
    return cls(capacity, alpha=0.6, beta=0.4)


def torchrl_dqn_loop(kind: str, frames: int, seed: int) -> dict:
    """torchrl's CartPole DQN (sota-implementations/dqn/dqn_cartpole.py, its config
    scaled down in frames), with a prioritized sampler; per-phase wall times."""
    from tensordict.nn import TensorDictSequential
    from torchrl.collectors import Collector
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    from torchrl.envs import GymEnv, RewardSum, StepCounter, TransformedEnv
    from torchrl.modules import MLP, EGreedyModule, QValueActor
    from torchrl.objectives import DQNLoss, HardUpdate

    torch.manual_seed(seed)
    np.random.seed(seed)
    warmup = min(10_000, max(1_000, frames // 4 // 1_000 * 1_000))   # random frames first

    def make_env():
        return TransformedEnv(GymEnv("CartPole-v1"), StepCounter()).append_transform(RewardSum())

    env = make_env()
    net = MLP(in_features=env.observation_spec["observation"].shape[-1],
              out_features=env.action_spec.shape[-1], num_cells=[120, 84],
              activation_class=torch.nn.ReLU)
    model = QValueActor(net, in_keys=["observation"], spec=env.action_spec)
    greedy = EGreedyModule(annealing_num_steps=frames // 2, eps_init=1.0, eps_end=0.05,
                           spec=model.spec)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10_000), batch_size=128,
                                sampler=make_sampler(kind, 10_000), priority_key="td_error")
    loss = DQNLoss(value_network=model, loss_function="l2", delay_value=True)
    loss.make_value_estimator(gamma=0.99)
    target = HardUpdate(loss, value_network_update_interval=50)
    opt = torch.optim.Adam(loss.parameters(), lr=2.5e-4)
    collector = Collector(create_env_fn=make_env, policy=TensorDictSequential(model, greedy),
                          frames_per_batch=1000, total_frames=frames, device="cpu",
                          init_random_frames=warmup, auto_register_policy_transforms=False)
    t = {"replay": 0.0, "updates": 0, "frames": 0}
    t0 = time.perf_counter()
    for data in collector:
        data = data.reshape(-1)
        t["frames"] += data.numel()
        rb.extend(data)
        greedy.step(data.numel())
        if t["frames"] < warmup:
            continue
        for _ in range(100):
            ts = time.perf_counter()
            batch = rb.sample()
            t["replay"] += time.perf_counter() - ts
            loss_td = loss(batch)
            opt.zero_grad()
            loss_td["loss"].backward()
            opt.step()
            target.step()
            ts = time.perf_counter()
            rb.update_tensordict_priority(batch)
            t["replay"] += time.perf_counter() - ts
            t["updates"] += 1
    t["wall"] = time.perf_counter() - t0
    collector.shutdown()
    return t


def sample_update_alone(kind: str, capacity: int, batch: int, seconds: float) -> float:
    """Microseconds per sample(batch) + update_priority(batch) on a full sampler."""
    from torchrl.data import LazyTensorStorage
    storage = LazyTensorStorage(capacity)
    storage.set(torch.arange(capacity), torch.zeros(capacity))
    sampler = make_sampler(kind, capacity)
    sampler.update_priority(torch.arange(capacity), torch.rand(capacity) + 0.01)
    pool = torch.rand(64, batch) + 0.01
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds or n < 20:
        idx, _ = sampler.sample(storage, batch)
        sampler.update_priority(idx, pool[n % 64])
        n += 1
    return 1e6 * (time.perf_counter() - t0) / n


def bench_torchrl(seeds: list[int], frames: int, seconds: float) -> None:
    print(f"\n== torchrl: PrioritizedSampler (C++ segment tree) vs pal_hpc KSumPrioritizedSampler", flush=True)
    for batch in (128, 256):
        us = {k: sample_update_alone(k, 1 << 20, batch, seconds) for k in ("torchrl", "pal_hpc")}
        print(f"  sample + update_priority, capacity 2^20, batch {batch}: torchrl {us['torchrl']:.1f} us, "
              f"pal_hpc {us['pal_hpc']:.1f} us, speed-up {ratio(us['torchrl'], us['pal_hpc'])} "
              f"(target >= 2x)", flush=True)
    print(f"  DQN loop of torchrl's design on CartPole-v1, {frames:,} frames, 100 updates per "
          f"1,000 frames, replay 10,000, batch 128:", flush=True)
    res = {"torchrl": [], "pal_hpc": []}
    for seed in seeds:
        for kind in res:
            r = torchrl_dqn_loop(kind, frames, seed)
            res[kind].append(r)
            print(f"    seed {seed} {kind:<8} wall {r['wall']:.1f} s: {1e6 * r['wall'] / r['frames']:.0f} us/env step, "
                  f"{1e3 * r['wall'] / max(r['updates'], 1):.2f} ms/update "
                  f"(replay sample+priority {1e3 * r['replay'] / max(r['updates'], 1):.3f} ms/update)", flush=True)
    w = {k: statistics.median(r["wall"] for r in v) for k, v in res.items()}
    rp = {k: statistics.median(r["replay"] / max(r["updates"], 1) for r in v) for k, v in res.items()}
    print(f"  end to end (median wall): torchrl {w['torchrl']:.1f} s, pal_hpc {w['pal_hpc']:.1f} s, "
          f"speed-up {ratio(w['torchrl'], w['pal_hpc'])} (target >= 1.3x); replay part alone "
          f"{ratio(rp['torchrl'], rp['pal_hpc'])}")
    # The bound on the end-to-end target: the share of torchrl's loop that its whole
    # replay (sampler and TensorDict storage work) takes.  A replay that cost nothing
    # would make the loop at most 1 / (1 - share) faster.
    share = statistics.median(r["replay"] / r["wall"] for r in res["torchrl"])
    print(f"  torchrl's replay (sample + priority update, sampler and storage) is "
          f"{100 * share:.1f}% of its loop's wall time: a free replay would make the loop at "
          f"most {1 / (1 - share):.3f}x faster")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 seed and short runs (a smoke check)")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per configuration (default 5; --quick 1)")
    ap.add_argument("--only", choices=["sb3-dqn", "sb3-sac", "torchrl"], action="append",
                    help="run only these parts (repeatable)")
    args = ap.parse_args()
    torch.set_num_threads(1)   # as each pal_hpc rank (Config.torch_threads = 1)
    seeds = list(range(args.seeds or (1 if args.quick else 5)))
    parts = args.only or ["sb3-dqn", "sb3-sac", "torchrl"]
    print(f"bench_integrations: seeds {seeds}{' (quick)' if args.quick else ''}; torch "
          f"{torch.__version__}, 1 thread", flush=True)
    if "sb3-dqn" in parts:
        bench_sb3("dqn", seeds, 6_000 if args.quick else 100_000, 475.0,
                  3_000 if args.quick else 5_000)
    if "sb3-sac" in parts:
        bench_sb3("sac", seeds, 1_500 if args.quick else 20_000, -200.0,
                  500 if args.quick else 2_000)
    if "torchrl" in parts:
        bench_torchrl(seeds, 4_000 if args.quick else 50_000, 0.5 if args.quick else 3.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
