"""PPO (Schulman et al. 2017) on the on-policy contract (`pal_hpc.algos.onpolicy`), as
CleanRL's ppo.py / ppo_continuous_action.py / ppo_atari.py compute it.

A round is num_steps steps of every env of every node.  `begin_update` takes the
master's rollout: observations normalized with the round's frozen statistics, rewards
clipped or scaled, GAE (`loss.gae`), and this master's rows of the batch (env-major:
env e's steps t = 0..T-1, reset steps left out) with their advantages, returns and old
values; that table and the round's normalization moments are what it gives every
other master.  `update_plan` merges the moments (`normalize`), then for each of
update_epochs epochs draws one permutation of the whole batch -- the rows of all
masters in master order, the same generator on every master -- and splits it into
num_minibatches minibatches; each master differentiates its own rows of each
(`compute_gradients`), and the masters' summed gradient (one Allreduce) is the
minibatch's, clipped to max_grad_norm and stepped by one Adam.  --target-kl: after an
epoch, when the approx KL of its last minibatch (over all masters) exceeds it, the
round's remaining epochs are skipped (CleanRL's rule).
"""

from __future__ import annotations

import copy
import json

import gymnasium as gym
import numpy as np
import torch

from pal_hpc.algos.nets import Bf16Acting, FlatParams, is_image, seeded
from pal_hpc.algos.onpolicy import OnPolicyAlgorithm
from pal_hpc.algos.optim import FlatAdam
from pal_hpc.algos.ppo import config as C
from pal_hpc.algos.ppo.loss import SUMS, explained_variance, gae, ppo_loss
from pal_hpc.algos.ppo.network import NumpyHeads, PPONet, PPOPolicy, sample
from pal_hpc.algos.ppo.numpy_grad import NumpyGrad
from pal_hpc.algos.ppo.normalize import RunningMoments, discounted_returns, moments
from pal_hpc.options import ConfigError


class PPO(C.PPOSpec, OnPolicyAlgorithm):
    """The actor-critic, its Adam over one flat buffer, the normalizers, the shuffles."""

    phase = "ppo"
    metrics_every = 1                    # a learner row every round, as CleanRL logs
    update_sums = len(SUMS)
    metric_names = (*SUMS, "explained_variance", "epochs", "grad_norm", "lr")

    def __init__(self, obs_space: gym.Space, act_space: gym.Space,
                 config: C.PPOConfig | None = None, *, device="cpu", seed: int = 0,
                 gamma: float = 0.99):
        config = config or C.PPOConfig()
        super().__init__(obs_space, act_space, config, device=device, seed=seed)
        if not 0 < gamma <= 1:
            raise ConfigError(f"gamma: must be in (0, 1], got {gamma!r}")
        self.gamma = float(gamma)
        self.device = torch.device(device)
        self.image = is_image(obs_space)
        self.continuous = isinstance(act_space, gym.spaces.Box)
        self.clip_rewards = (config.clip_rewards == "on"
                             or (config.clip_rewards == "auto" and self.image))
        self.net = seeded(seed, lambda: PPONet(
            obs_space, act_space, config.cnn, tuple(config.hidden), config.activation,
            config.shared_torso, config.init, config.log_std_init)).to(self.device)
        # Small MLPs on the CPU act, and separate ones learn, through numpy (in fp32).
        fp32 = config.precision == "fp32"
        self._np = (NumpyHeads(self.net) if fp32 and NumpyHeads.fits(self.net, self.device)
                    else None)
        self._npgrad = (NumpyGrad(self.net) if fp32 and NumpyGrad.fits(self.net, self.device)
                        else None)
        self._params = FlatParams([self.net], self.device)
        self._flat, self._flat_grad = self._params.flat, self._params.grad
        self.optimizer = FlatAdam(self._flat, lr=config.lr, eps=config.adam_eps)
        self._bf16 = Bf16Acting(self.net) if not fp32 else None
        self.obs_norm = RunningMoments(obs_space.shape) if config.norm_obs else None
        self.ret_norm = RunningMoments(()) if config.norm_reward else None
        self._ret_carry = None           # per env discounted return (reward scaling)
        self.shuffle = np.random.default_rng([seed, 36])   # the same on every master
        self.updates = 0                 # rounds learned
        self.progress = 0.0              # the run's fraction done after the last round
        self.lr_progress = 0.0           # ... before it: the learning rate's
        self._round: dict = {}
        self._sums = np.zeros(len(SUMS), np.float32)

    def rollout_fields(self):
        return {"logprob": ((), np.float32), "value": ((), np.float32)}

    # ---- acting ---------------------------------------------------------------------

    def make_policy(self, actor_index: int = 0, n_actors: int = 1) -> PPOPolicy:
        net = copy.deepcopy(self.net).cpu().requires_grad_(False)
        return PPOPolicy(net, copy.deepcopy(self.obs_norm), self.config.norm_clip)

    def policy_params(self) -> np.ndarray:
        return self.get_flat_params()

    def _obs(self, obs: np.ndarray) -> torch.Tensor:
        """Observations as the network takes them: frames as uint8, vectors float32,
        normalized with the round's statistics when norm_obs."""
        if self.image:
            return torch.as_tensor(obs, device=self.device)
        if self.obs_norm is not None:
            obs = self.obs_norm.normalize(obs, self.config.norm_clip)
        return torch.as_tensor(obs, dtype=torch.float32, device=self.device)

    def _heads(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self._np is not None:
            if self.obs_norm is not None:
                obs = self.obs_norm.normalize(obs, self.config.norm_clip)
            return self._np(obs)
        with torch.inference_mode():
            net = self.net if self._bf16 is None else self._bf16()
            out, value = net(self._obs(obs))
        return out.cpu().numpy(), value.cpu().numpy()

    def rollout_act(self, obs, rng):
        out, value = self._heads(obs)
        log_std = None if self.net.log_std is None else self.net.log_std.detach().cpu().numpy()
        actions, logp = sample(out, log_std, rng)
        return actions, {"logprob": logp, "value": value}

    def act(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return self.rollout_act(obs, rng)[0]

    def env_actions(self, actions: np.ndarray) -> np.ndarray:
        # The environments' actions are in [-1, 1] (make_env): CleanRL's ClipAction.
        return np.clip(actions, -1.0, 1.0) if self.continuous else actions

    # ---- the round's update -------------------------------------------------------------

    def learning_rate(self) -> float:
        """lr * (1 - the run's fraction done before this round) with annealing, else lr
        (CleanRL: 1 - (iteration - 1) / iterations)."""
        c = self.config
        return c.lr * max(0.0, 1.0 - self.lr_progress) if c.lr_anneal else c.lr

    def clip_coef(self) -> float:
        c = self.config
        return c.clip_coef * max(0.0, 1.0 - self.lr_progress) if c.clip_anneal else c.clip_coef

    def anneal_progress(self, done_steps: int, total_steps: int) -> float:
        return min(1.0, done_steps / total_steps)

    def set_progress(self, fraction: float) -> None:
        """The run's fraction done after the round about to be learned; that round
        anneals with the fraction before it."""
        self.lr_progress, self.progress = self.progress, float(fraction)

    def rewards(self, batch: dict) -> tuple[np.ndarray, np.ndarray | None]:
        """The round's rewards for learning (sign-clipped or scaled by the return's
        running std, frozen for the round) and the discounted returns whose moments
        update that std (None without norm_reward)."""
        reward = np.asarray(batch["reward"], np.float64)
        if self.clip_rewards:
            reward = np.sign(reward)
        if self.ret_norm is None:
            return reward, None
        if self._ret_carry is None or len(self._ret_carry) != reward.shape[1]:
            self._ret_carry = np.zeros(reward.shape[1])
        g, self._ret_carry = discounted_returns(
            self._ret_carry, reward, batch["valid"],
            batch["terminated"] | batch["truncated"], self.gamma)
        scaled = reward / np.sqrt(self.ret_norm.var + 1e-8)
        return np.clip(scaled, -self.config.norm_clip, self.config.norm_clip), g

    def begin_update(self, batch: dict) -> dict:
        """GAE on this master's round and its rows of the batch; returns the table
        every master needs: {"rows": (k, 3) [advantage, return, old value], "obs",
        "ret": the round's normalization moments or None}."""
        obs = batch["obs"]
        t_max, n = np.shape(batch["reward"])
        _, last_value = self._heads(obs[t_max])
        values = np.concatenate([batch["value"], last_value[None]]).astype(np.float64)
        reward, disc = self.rewards(batch)
        adv, ret = gae(reward, values, batch["terminated"], batch["truncated"],
                       self.gamma, self.config.gae_lambda)
        rows = np.flatnonzero(np.asarray(batch["valid"]).T.reshape(-1))   # env-major

        def em(x):                     # (T, N, ...) -> this master's rows, env-major
            x = np.swapaxes(np.asarray(x), 0, 1)
            return x.reshape(n * t_max, *x.shape[2:])[rows]

        cols = {"action": em(batch["action"]).astype(np.float32 if self.continuous
                                                      else np.int64),
                **{k: em(x).astype(np.float32) for k, x in (
                    ("logprob", batch["logprob"]), ("value", values[:t_max]), ("ret", ret),
                    ("adv", adv))}}
        if self._npgrad is not None:
            x = em(obs[:t_max])
            cols["obs"] = (x if self.obs_norm is None
                           else self.obs_norm.normalize(x, self.config.norm_clip))
            self._round = cols
        else:
            self._round = {k: torch.as_tensor(v, device=self.device) for k, v in cols.items()}
            self._round["obs"] = self._obs(em(obs[:t_max]))
        return {"rows": np.stack([em(adv), em(ret), em(values[:t_max])], axis=1),
                "obs": None if self.obs_norm is None else moments(
                    np.asarray(obs[1:]).reshape(t_max * n, -1)),
                "ret": None if disc is None else moments(disc[:, None])}

    def update_plan(self, batch, gathered, master):
        """Merge every master's moments, then the epochs' minibatch steps (see the
        module docstring); ends early on --target-kl; counts the round."""
        for part in gathered:            # master order: the same sums on every master
            if part["obs"] is not None:
                self.obs_norm.merge(part["obs"])
            if part["ret"] is not None:
                self.ret_norm.merge(part["ret"])
        table = np.concatenate([p["rows"] for p in gathered])
        offset = sum(len(p["rows"]) for p in gathered[:master])
        mine = len(gathered[master]["rows"])
        cfg = self.config
        self.optimizer.lr = self.learning_rate()
        self._clip = self.clip_coef()
        self._clipfrac, self._steps, epochs = 0.0, 0, 0
        self._ev = explained_variance(table[:, 2], table[:, 1])
        for _ in range(cfg.update_epochs):
            epochs += 1
            for mb in np.array_split(self.shuffle.permutation(len(table)), cfg.num_minibatches):
                local = mb[(mb >= offset) & (mb < offset + mine)] - offset
                a = table[mb, 0]
                std = a.std(ddof=1) if len(a) > 1 else 0.0
                yield {"rows": local, "size": len(mb), "adv_mean": a.mean() if len(a) else 0.0,
                       "adv_std": std}
            if cfg.target_kl is not None and self._last[3] > cfg.target_kl:
                break
        self._epochs = epochs
        self.updates += 1

    def compute_gradients(self, phase, batch, out, metrics=False):
        """This master's rows of one minibatch: the loss's gradient into `out`, its
        sums (`step_sums`); (metrics: {}, None) -- the round's come from the sums."""
        self._check_phase(phase)
        cfg = self.config
        if self._npgrad is not None:
            return self._numpy_gradients(batch, out)
        r, rows = self._round, torch.as_tensor(batch["rows"], device=self.device)
        self._flat_grad.zero_()
        logp, entropy, value = self.net.evaluate(r["obs"][rows], r["action"][rows],
                                                 cfg.precision)
        adv = r["adv"][rows]
        if cfg.norm_adv:
            adv = (adv - float(batch["adv_mean"])) / (float(batch["adv_std"]) + 1e-8)
        loss, sums = ppo_loss(logp, entropy, value, r["logprob"][rows], adv, r["ret"][rows],
                              r["value"][rows], max(batch["size"], 1), clip_coef=self._clip,
                              clip_vloss=cfg.clip_vloss, ent_coef=cfg.ent_coef,
                              vf_coef=cfg.vf_coef)
        loss.backward()
        out[...] = self._flat_grad.cpu().numpy()
        self._sums = sums.cpu().numpy()
        self._size = max(batch["size"], 1)
        return {}, None

    def _numpy_gradients(self, batch, out):
        r, rows, cfg = self._round, batch["rows"], self.config
        adv = r["adv"][rows]
        if cfg.norm_adv:
            adv = ((adv - batch["adv_mean"]) / (batch["adv_std"] + 1e-8)).astype(np.float32)
        self._size = max(batch["size"], 1)
        self._sums = self._npgrad(r["obs"][rows], r["action"][rows], r["logprob"][rows], adv,
                                  r["ret"][rows], r["value"][rows], self._size,
                                  clip_coef=self._clip, clip_vloss=cfg.clip_vloss,
                                  ent_coef=cfg.ent_coef, vf_coef=cfg.vf_coef)
        out[...] = self._flat_grad.numpy()
        return {}, None

    def step_sums(self) -> np.ndarray:
        return self._sums

    def grad_scale(self, masters: int) -> float:
        return 1.0                        # each master's rows are already over B

    def apply_gradients(self, phase, flat_grad, scale=1.0) -> None:
        """Clip the minibatch's gradient to max_grad_norm (torch's clip_grad_norm_
        rule) and take one Adam step at the round's learning rate."""
        self._check_phase(phase)
        g = torch.as_tensor(np.asarray(flat_grad, np.float32), device=self.device)
        torch.mul(g, scale, out=self._flat_grad)
        norm = torch.linalg.vector_norm(self._flat_grad)
        if self.config.max_grad_norm > 0:
            self._flat_grad.mul_(torch.clamp(self.config.max_grad_norm / (norm + 1e-6), max=1.0))
        self.optimizer.step(self._flat_grad)
        self.params_written()
        self._grad_norm = float(norm)

    def after_step(self, sums: np.ndarray) -> None:
        self._last = np.asarray(sums, np.float64) / self._size
        self._clipfrac += self._last[5]
        self._steps += 1

    def round_metrics(self, metrics):
        """The last minibatch's losses and KLs, the round's mean clip fraction, the
        explained variance of the round's old values, epochs run, as CleanRL logs."""
        out = dict(zip(SUMS, self._last.tolist()))
        out.update(clipfrac=self._clipfrac / max(self._steps, 1), explained_variance=self._ev,
                   epochs=float(self._epochs), grad_norm=self._grad_norm,
                   lr=self.optimizer.lr)
        return out

    # ---- parameters and checkpoints -------------------------------------------------

    def state_arrays(self) -> list[np.ndarray]:
        out = [self.policy_params(), self.optimizer.exp_avg.detach().cpu().numpy(),
               self.optimizer.exp_avg_sq.detach().cpu().numpy()]
        for norm in (self.obs_norm, self.ret_norm):
            if norm is not None:
                out += [np.atleast_1d(norm.mean), np.atleast_1d(norm.var),
                        np.array([norm.count])]
        return out

    def state_dict(self) -> dict:
        state = {"net": self.net.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "updates": self.updates, "progress": self.progress,
                 "lr_progress": self.lr_progress,
                 "shuffle": json.dumps(self.shuffle.bit_generator.state)}
        for name, norm in (("obs_norm", self.obs_norm), ("ret_norm", self.ret_norm)):
            if norm is not None:
                state[name] = norm.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.net.load_state_dict(state["net"])
        self.params_written()
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])
        self.progress, self.lr_progress = float(state["progress"]), float(state["lr_progress"])
        self.shuffle.bit_generator.state = json.loads(state["shuffle"])
        for name, norm in (("obs_norm", self.obs_norm), ("ret_norm", self.ret_norm)):
            if norm is not None:
                norm.load_state_dict(state[name])
        self._ret_carry = None           # the environments start new episodes

    def signature(self) -> dict:
        c = self.config
        sig = {**super().signature(), "shared_torso": bool(c.shared_torso),
               "norm_obs": bool(c.norm_obs), "norm_reward": bool(c.norm_reward)}
        if self.image:
            sig["cnn"] = c.cnn
        else:
            sig["hidden"], sig["activation"] = list(c.hidden), c.activation
        return sig
