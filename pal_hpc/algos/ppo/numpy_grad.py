"""The minibatch loss's gradient of a small PPO network by hand, in numpy, on the CPU.

CartPole's network (two [64, 64] tanh MLPs) on a minibatch of 128 rows is a few
microseconds of arithmetic under torch's fixed cost per op: autograd's forward and
backward took about 2 ms a minibatch here, most of PPO's round.  For separate MLP
torsos on the CPU in fp32, `NumpyGrad` computes the same loss (`loss.ppo_loss`) and
its gradient with the chain rule written out, into views of the network's own
gradient buffers.  At ties of the losses' max it splits the gradient half and half,
as torch's `maximum` does; tests/test_ppo.py checks the gradient against autograd's.
"""

from __future__ import annotations

import numpy as np
from torch import nn

LOG_SQRT_2PI = 0.5 * np.log(2 * np.pi)


def _linears(trunk: nn.Sequential, head: nn.Linear) -> list[nn.Linear]:
    return [m for m in trunk if isinstance(m, nn.Linear)] + [head]


def _max_grad(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """d max(a, b) / d a and / d b, ties split half and half (torch's maximum)."""
    ga = (a > b) + 0.5 * (a == b)
    return ga, 1.0 - ga


class NumpyGrad:
    """Forward and backward of a `PPONet` with separate MLP torsos, in numpy, from
    views of its parameters and of their gradients (the flat buffers' views)."""

    def __init__(self, net):
        self.net = net
        self.tanh = any(isinstance(m, nn.Tanh) for m in net.trunk)
        self.actor = _linears(net.trunk, net.policy)
        self.critic = _linears(net.value_trunk, net.value)
        self._ptr = -1

    def _views(self) -> None:
        """(W, b, dW, db) numpy views per layer; rebuilt if a parameter's storage moved
        (PPO's parameters are views of one flat buffer for its life)."""
        ptr = self.net.policy.weight.data_ptr()
        if ptr != self._ptr:
            view = lambda m: (m.weight.detach().numpy(), m.bias.detach().numpy(),  # noqa: E731
                              m.weight.grad.numpy(), m.bias.grad.numpy())
            self._actor = [view(m) for m in self.actor]
            self._critic = [view(m) for m in self.critic]
            self._ptr = ptr

    @classmethod
    def fits(cls, net, device) -> bool:
        return (device.type == "cpu" and not net.image and net.value_trunk is not None
                and isinstance(net.trunk, nn.Sequential))

    def _forward(self, layers, x):
        acts = [x]
        for i, (w, b, _, _) in enumerate(layers):
            h = acts[-1] @ w.T + b
            if i < len(layers) - 1:
                h = np.tanh(h) if self.tanh else np.maximum(h, 0.0)
            acts.append(h)
        return acts

    def _backward(self, layers, acts, delta) -> None:
        for i in range(len(layers) - 1, -1, -1):
            w, _, gw, gb = layers[i]
            np.matmul(delta.T, acts[i], out=gw)
            np.sum(delta, axis=0, out=gb)
            if i:
                delta = delta @ w
                a = acts[i]
                delta *= (1.0 - a * a) if self.tanh else (a > 0)

    def __call__(self, obs, action, old_logp, adv, ret, old_v, size, *, clip_coef,
                 clip_vloss, ent_coef, vf_coef) -> np.ndarray:
        """Write the gradient of the loss of these rows (of a minibatch of `size`) into
        the parameters' gradients; returns the `loss.SUMS` of these rows (float32)."""
        net, c = self.net, clip_coef
        self._views()
        pa, va = self._forward(self._actor, obs), self._forward(self._critic, obs)
        out, v = pa[-1], va[-1][:, 0]
        if net.continuous:
            log_std = net.log_std.detach().numpy()
            std = np.exp(log_std)
            z = (action - out) / std
            logp = (-0.5 * z * z - log_std - LOG_SQRT_2PI).sum(axis=1)
            entropy = np.full(len(out), (0.5 + LOG_SQRT_2PI + log_std).sum(), np.float32)
        else:
            shifted = out - out.max(axis=1, keepdims=True)
            logp_all = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
            p = np.exp(logp_all)
            idx = np.arange(len(out))
            logp = logp_all[idx, action]
            entropy = -(p * logp_all).sum(axis=1)
        logratio = logp - old_logp
        ratio = np.exp(logratio)
        t1, clipped = -adv * ratio, np.clip(ratio, 1 - c, 1 + c)
        t2 = -adv * clipped
        g1, g2 = _max_grad(t1, t2)
        inside = (ratio >= 1 - c) & (ratio <= 1 + c)
        d_logp = (g1 * -adv + g2 * -adv * inside) * ratio / size
        u = (v - ret) ** 2
        if clip_vloss:
            vc = old_v + np.clip(v - old_v, -c, c)
            cl = (vc - ret) ** 2
            h1, h2 = _max_grad(u, cl)
            v_in = (v - old_v >= -c) & (v - old_v <= c)
            d_v = 0.5 * vf_coef / size * (h1 * 2 * (v - ret) + h2 * 2 * (vc - ret) * v_in)
            v_sum = 0.5 * np.maximum(u, cl).sum()
        else:
            d_v = vf_coef / size * (v - ret)
            v_sum = 0.5 * u.sum()
        if net.continuous:
            d_out = d_logp[:, None] * z / std
            net.log_std.grad.numpy()[...] = ((d_logp[:, None] * (z * z - 1)).sum(axis=0)
                                             - ent_coef * len(out) / size)
        else:
            d_out = -p * d_logp[:, None]
            d_out[idx, action] += d_logp
            d_out += ent_coef / size * p * (logp_all + entropy[:, None])
        self._backward(self._actor, pa, d_out.astype(np.float32))
        self._backward(self._critic, va, d_v[:, None].astype(np.float32))
        return np.array([np.maximum(t1, t2).sum(), v_sum, entropy.sum(),
                         ((ratio - 1) - logratio).sum(), (-logratio).sum(),
                         (np.abs(ratio - 1) > c).sum()], np.float32)
