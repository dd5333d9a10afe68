"""The Ray side of bench/bench_sync_q.py: synchronized parallel Q-learning on
Blackjack-v1 built the way the reactor-model paper's Ray baseline is (arXiv 2312.04704;
its code: github jackyk02/parallel_rl_benchmarks, 5.Parallel_Q_learning): one
`@ray.remote` rollout actor per worker, a remote replay-buffer actor, and a `ray.get`
barrier per round; the driver takes the gradient step and sends the weights out with
the next round's calls.  Runs in .venv-peers (Ray lives there, never in .venv).

    .venv-peers/bin/python bench/peer_ray_sync_q.py --batch 500 --rounds 500 --out W.npz

Setup (the issue's, as the paper's): 16 actors x 100 epsilon-greedy (0.1) steps a
round, a 3-32-2 MLP on the observation tuple as 3 floats, Adam lr 0.01, gamma 0.99,
MSE loss, target sync every 10 rounds, a replay of the last 20,000 transitions sampled
uniformly (with replacement; the paper's code took the buffer's first 1000 rows).
Prints one JSON line: the wall time from the first round's calls to the end of the
last round (actors already constructed), and the time to build them.  The final
online weights go to --out (fc1.weight, fc1.bias, fc2.weight, fc2.bias) for the common
greedy evaluation in bench_sync_q.py.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import gymnasium as gym
import numpy as np
import ray
import torch
from torch import nn


class _Net(nn.Module):
    """The paper's 3-32-2 MLP (fc1, ReLU, fc2)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(3, 32), nn.Linear(32, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


@ray.remote
class RolloutActor:
    """One worker: one Blackjack env, `steps` epsilon-greedy steps per call."""

    def __init__(self, seed: int, steps: int):
        torch.set_num_threads(1)
        self.env = gym.make("Blackjack-v1")
        self.obs = np.asarray(self.env.reset(seed=seed)[0], np.float32)
        self.rng = np.random.default_rng(seed)
        self.net = _Net()
        self.steps = steps

    def ready(self) -> bool:
        return True

    def rollout(self, weights: dict, epsilon: float):
        self.net.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
        n = self.steps
        obs = np.empty((n, 3), np.float32)
        nxt = np.empty((n, 3), np.float32)
        act = np.empty(n, np.int64)
        rew = np.empty(n, np.float32)
        done = np.empty(n, np.float32)
        for t in range(n):
            obs[t] = self.obs
            if self.rng.random() < epsilon:
                a = int(self.rng.integers(2))
            else:
                with torch.no_grad():
                    a = int(self.net(torch.from_numpy(self.obs[None])).argmax(1).item())
            o, r, term, trunc, _ = self.env.step(a)
            act[t], rew[t], done[t] = a, r, float(term)
            nxt[t] = np.asarray(o, np.float32)
            if term or trunc:
                o, _ = self.env.reset()
            self.obs = np.asarray(o, np.float32)
        return obs, act, rew, nxt, done


@ray.remote
class ReplayBufferActor:
    """The last `capacity` transitions; uniform samples with a seeded generator."""

    def __init__(self, capacity: int, seed: int):
        self.cap, self.n, self.head = capacity, 0, 0
        self.cols = [np.zeros((capacity, 3), np.float32), np.zeros(capacity, np.int64),
                     np.zeros(capacity, np.float32), np.zeros((capacity, 3), np.float32),
                     np.zeros(capacity, np.float32)]
        self.rng = np.random.default_rng(seed)

    def add_and_sample(self, rollouts: list, batch: int):
        for part in rollouts:
            k = len(part[1])
            idx = (self.head + np.arange(k)) % self.cap
            for col, arr in zip(self.cols, part):
                col[idx] = arr
            self.head = (self.head + k) % self.cap
            self.n = min(self.n + k, self.cap)
        pick = self.rng.integers(0, self.n, batch)
        return [col[pick] for col in self.cols]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=500)
    ap.add_argument("--actors", type=int, default=16)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    t_init = time.monotonic()
    ray.init(num_cpus=len(os.sched_getaffinity(0)), include_dashboard=False,
             log_to_driver=False, logging_level="ERROR")
    actors = [RolloutActor.remote(args.seed * 1000 + i, args.steps) for i in range(args.actors)]
    buffer = ReplayBufferActor.remote(20_000, args.seed)
    ray.get([a.ready.remote() for a in actors])          # every actor is up
    setup_s = time.monotonic() - t_init
    net, target = _Net(), _Net()
    target.load_state_dict(net.state_dict())
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    weights = {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}
    t0 = time.monotonic()
    for rnd in range(args.rounds):
        rollouts = ray.get([a.rollout.remote(weights, 0.1) for a in actors])
        obs, act, rew, nxt, done = (torch.from_numpy(x) for x in
                                    ray.get(buffer.add_and_sample.remote(rollouts, args.batch)))
        q = net(obs).gather(1, act[:, None]).squeeze(1)
        with torch.no_grad():
            tgt = rew + 0.99 * target(nxt).max(1).values * (1.0 - done)
        loss = nn.functional.mse_loss(q, tgt)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (rnd + 1) % 10 == 0:                     # target sync every 10 rounds
            target.load_state_dict(net.state_dict())
        weights = {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}
    wall = time.monotonic() - t0
    np.savez(args.out, **weights)
    ray.shutdown()
    print(json.dumps({"wall_s": wall, "setup_s": setup_s, "rounds": args.rounds,
                      "batch": args.batch, "actors": args.actors}), flush=True)


if __name__ == "__main__":
    main()
