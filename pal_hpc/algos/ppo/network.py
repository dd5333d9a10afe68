"""PPO's network and acting: an actor-critic with a categorical or a diagonal Gaussian
policy (CleanRL's `Agent`s: separate tanh MLPs on vectors, one Nature CNN torso on
frames), its log-probabilities and entropies, acting with a numpy generator (torch, or
numpy for small MLPs on the CPU), and the CPU policy evaluations use."""

from __future__ import annotations

import math
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from pal_hpc.algos.base import NetworkPolicy
from pal_hpc.algos.nets import autocast, is_image, output_linear, torso
from pal_hpc.algos.paac.network import sample_actions

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


class PPONet(nn.Module):
    """A policy head (logits, or a Gaussian's mean with a state-independent log std)
    and a value head, on one shared torso or on one torso each (`shared`)."""

    def __init__(self, obs_space: gym.Space, act_space: gym.Space, cnn: str = "nature",
                 hidden: Sequence[int] = (64, 64), activation: str = "tanh",
                 shared: bool = False, init: str = "orthogonal", log_std_init: float = 0.0):
        super().__init__()
        self.continuous = isinstance(act_space, gym.spaces.Box)
        out = int(np.prod(act_space.shape)) if self.continuous else int(act_space.n)
        self.image = is_image(obs_space)
        self.trunk = torso(obs_space, cnn, hidden, activation)
        self.value_trunk = None if shared else torso(obs_space, cnn, hidden, activation)
        self.policy = nn.Linear(self.trunk.out_features, out)
        self.value = nn.Linear(self.trunk.out_features, 1)
        self.log_std = (nn.Parameter(torch.full((out,), float(log_std_init)))
                        if self.continuous else None)
        if init == "orthogonal":          # CleanRL's layer_init; "torch" keeps torch's own
            with torch.no_grad():
                for m in self.modules():
                    if isinstance(m, (nn.Linear, nn.Conv2d)):
                        nn.init.orthogonal_(m.weight, math.sqrt(2.0))
                        m.bias.zero_()
                nn.init.orthogonal_(self.policy.weight, 0.01)
                nn.init.orthogonal_(self.value.weight, 1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits or means (B, out), values (B,)), float32: the heads run in fp32
        under bf16 autocast too (`nets.output_linear`), so log-probabilities and their
        ratios keep fp32's resolution."""
        z = self.trunk(obs)
        zv = z if self.value_trunk is None else self.value_trunk(obs)
        return (output_linear(z, self.policy.weight, self.policy.bias),
                output_linear(zv, self.value.weight, self.value.bias).squeeze(-1))

    def evaluate(self, obs: torch.Tensor, action: torch.Tensor, precision: str = "fp32"
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(log pi(action|obs), entropy, value), each (B,) float32; `precision` bf16
        runs the torso under bf16 autocast."""
        with autocast(obs.device, precision):
            out, value = self(obs)
        if self.continuous:
            log_std = self.log_std.expand_as(out)
            z = (action - out) / log_std.exp()
            logp = (-0.5 * z * z - log_std - LOG_SQRT_2PI).sum(-1)
            entropy = (0.5 + LOG_SQRT_2PI + log_std).sum(-1)
            return logp, entropy, value
        log_probs = torch.log_softmax(out, dim=-1)
        logp = log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        return logp, entropy, value


def sample(out: np.ndarray, log_std: np.ndarray | None, rng: np.random.Generator
           ) -> tuple[np.ndarray, np.ndarray]:
    """(actions, their log-probabilities float32) from the policy head's output `out`
    (logits, or means with `log_std`) drawn with `rng` (numpy: checkpointed)."""
    if log_std is None:
        actions = sample_actions(out, rng)
        z = out.astype(np.float64)
        z -= z.max(axis=1, keepdims=True)
        logp = z[np.arange(len(z)), actions] - np.log(np.exp(z).sum(axis=1))
        return actions, logp.astype(np.float32)
    eps = rng.standard_normal(out.shape)
    actions = (out + np.exp(log_std) * eps).astype(np.float32)
    logp = (-0.5 * eps * eps - log_std - LOG_SQRT_2PI).sum(axis=1)
    return actions, logp.astype(np.float32)


class NumpyHeads:
    """The policy output and value of an MLP `PPONet` computed with numpy on the CPU,
    from views of the network's own parameters: torch's fixed cost per op is most of
    a small network's forward pass on a few observations (as `paac.NumpyLogits`)."""

    def __init__(self, net: PPONet):
        self.net = net
        self.tanh = any(isinstance(m, nn.Tanh) for m in net.trunk)
        self._ptr = -1

    @classmethod
    def fits(cls, net: PPONet, device: torch.device) -> bool:
        return device.type == "cpu" and not net.image and isinstance(net.trunk, nn.Sequential)

    def _build(self) -> None:
        net = self.net

        def chain(trunk, head):
            return [(m.weight.detach().numpy().T, m.bias.detach().numpy())
                    for m in [*(x for x in trunk if isinstance(x, nn.Linear)), head]]

        self.actor = chain(net.trunk, net.policy)
        self.critic = (None if net.value_trunk is None
                       else chain(net.value_trunk, net.value))
        self.value_head = (net.value.weight.detach().numpy().T, net.value.bias.detach().numpy())
        self.log_std = None if net.log_std is None else net.log_std.detach().numpy()
        self._ptr = net.policy.weight.data_ptr()

    def _run(self, layers, h, last_act: bool = False):
        for i, (wt, b) in enumerate(layers):
            h = h @ wt
            h += b
            if i < len(layers) - 1 or last_act:
                np.tanh(h, out=h) if self.tanh else np.maximum(h, 0.0, out=h)
        return h

    def __call__(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.net.policy.weight.data_ptr() != self._ptr:
            self._build()
        x = np.asarray(obs, np.float32).reshape(len(obs), -1)
        if self.critic is not None:
            return self._run(self.actor, x), self._run(self.critic, x)[:, 0]
        z = self._run(self.actor[:-1], x, last_act=True)
        out = self._run(self.actor[-1:], z)
        wt, b = self.value_head
        return out, (z @ wt + b)[:, 0]


class PPOPolicy(NetworkPolicy):
    """A CPU copy of the network with the observation statistics of its time: samples
    from the policy, or (deterministic, for evaluation) takes its most likely action
    (the Gaussian's mean, clipped to the action bounds)."""

    def __init__(self, net: PPONet, obs_norm=None, clip: float = 10.0):
        super().__init__(net)
        self.obs_norm, self.clip = obs_norm, clip

    @torch.no_grad()
    def act(self, obs, rng, global_steps, deterministic=False):
        if self.obs_norm is not None:
            obs = self.obs_norm.normalize(obs, self.clip)
        x = torch.as_tensor(obs) if self.net.image else torch.as_tensor(obs, dtype=torch.float32)
        out, _ = self.net(x)
        out = out.numpy()
        if deterministic:
            return (np.clip(out, -1.0, 1.0) if self.net.continuous
                    else out.argmax(axis=1).astype(np.int64))
        log_std = None if self.net.log_std is None else self.net.log_std.numpy()
        actions, _ = sample(out, log_std, rng)
        return np.clip(actions, -1.0, 1.0) if self.net.continuous else actions
