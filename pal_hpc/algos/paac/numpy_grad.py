"""PAAC's loss and its gradient for a small MLP actor-critic, by hand in numpy on the CPU.

A round of CartPole at the zoo's settings is 5 steps of 8 environments: 48 rows through
two [64, 64] tanh MLPs, a few microseconds of arithmetic under torch's fixed cost per
op.  Autograd's forward and backward of `loss.actor_critic_loss` took 1.08 ms of the
master's 2.7 ms round (`bench/profile_paac_act.py`); this computes the same loss and
its gradient with the chain rule written out, into views of the network's own gradient
buffers (the flat buffer the Allreduce sends).  Shared or separate torsos, ReLU or
tanh, fp32 on the CPU (`NumpyGrad.fits`); frames, GPUs and bf16 stay on autograd.

With L the loss of `loss.actor_critic_loss` (before loss_scale), c the number of valid
steps, m_t the valid mask, A_t = R_t - V(s_t) (a constant, as `detach` makes it), p the
policy and H its entropy, the gradient at step t < t_max is

    dL/dlogits_t = m_t / c * (A_t (p - onehot(a_t)) + entropy * p (log p + H))
    dL/dV(s_t)   = m_t / c * 2 value_coef (V(s_t) - R_t)

and zero at s_{t_max}, whose value only bootstraps the returns.  The results agree with
autograd's to float32 rounding (tests/test_paac.py), not bit for bit: a run's numbers
are those of this path wherever it fits, on every master alike.
"""

from __future__ import annotations

import numpy as np
from torch import nn

from pal_hpc.algos.paac.loss import nstep_returns


class NumpyGrad:
    """Forward and backward of an `ActorCritic` with an MLP torso (shared, or one per
    head), in numpy, from views of its parameters and their gradients."""

    def __init__(self, net):
        self.net = net
        self.tanh = any(isinstance(m, nn.Tanh) for m in net.trunk)
        self.shared = net.value_trunk is None
        self.trunk = [m for m in net.trunk if isinstance(m, nn.Linear)]
        self.value_trunk = (None if self.shared else
                            [m for m in net.value_trunk if isinstance(m, nn.Linear)])
        self._ptr = -1

    @classmethod
    def fits(cls, net, device, bf16: bool) -> bool:
        """Whether `net` on `device` at that precision takes this path."""
        if device.type != "cpu" or bf16 or net.image or not isinstance(net.trunk,
                                                                        nn.Sequential):
            return False
        acts = {type(m) for t in (net.trunk, net.value_trunk) if t is not None
                for m in t if not isinstance(m, nn.Linear)}
        return len(acts) <= 1 and acts <= {nn.Tanh, nn.ReLU}

    def _views(self) -> None:
        """(W, b, dW, db) views per layer, rebuilt if a parameter's storage moved (PAAC's
        parameters are views of one flat buffer for its life: FlatParams)."""
        ptr = self.net.policy.weight.data_ptr()
        if ptr != self._ptr:
            view = lambda m: (m.weight.detach().numpy(), m.bias.detach().numpy(),  # noqa: E731
                              m.weight.grad.numpy(), m.bias.grad.numpy())
            self._trunk = [view(m) for m in self.trunk]
            self._vtrunk = None if self.shared else [view(m) for m in self.value_trunk]
            self._policy, self._value = view(self.net.policy), view(self.net.value)
            self._ptr = ptr

    def _forward(self, layers, x) -> list[np.ndarray]:
        """The torso's activations, input first."""
        acts = [x]
        for w, b, _, _ in layers:
            h = acts[-1] @ w.T
            h += b
            if self.tanh:
                np.tanh(h, out=h)
            else:
                np.maximum(h, 0.0, out=h)
            acts.append(h)
        return acts

    def _backward(self, layers, acts, delta) -> None:
        """Backpropagate `delta` (dL/d of the torso's output) into its gradients."""
        for i in range(len(layers) - 1, -1, -1):
            w, _, gw, gb = layers[i]
            a = acts[i + 1]
            delta = delta * ((1.0 - a * a) if self.tanh else (a > 0))
            np.matmul(delta.T, acts[i], out=gw)
            np.sum(delta, axis=0, out=gb)
            if i:
                delta = delta @ w

    def __call__(self, batch, *, gamma, clip_rewards, loss_scale, value_coef,
                 entropy_coef, metrics) -> dict[str, float]:
        """Write the round's loss gradient into the network's gradient buffers; returns
        the loss's parts when `metrics` (the names of `loss.actor_critic_loss`)."""
        self._views()
        t_max, n = np.shape(batch["reward"])
        obs = np.asarray(batch["obs"], np.float32).reshape((t_max + 1) * n, -1)
        pw, pb, pgw, pgb = self._policy
        vw, vb, vgw, vgb = self._value       # weights, biases and their gradients' views
        acts = self._forward(self._trunk, obs)
        vacts = acts if self.shared else self._forward(self._vtrunk, obs)
        logits = acts[-1][:t_max * n] @ pw.T + pb
        values = (vacts[-1] @ vw.T + vb)[:, 0]
        rewards = np.asarray(batch["reward"], np.float64)
        if clip_rewards:
            rewards = np.clip(rewards, -1.0, 1.0)
        returns = nstep_returns(rewards, values.reshape(t_max + 1, n), batch["terminated"],
                                batch["truncated"], gamma).astype(np.float32).reshape(-1)
        valid = np.asarray(batch["valid"]).reshape(-1)
        count = float(max(valid.sum(), 1))
        v = values[:t_max * n]
        adv = returns - v
        z = logits - logits.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        p = np.exp(logp)
        rows = np.arange(t_max * n)
        action = np.asarray(batch["action"]).reshape(-1)
        scale = loss_scale / count * valid.astype(np.float32)
        entropy = -(p * logp).sum(axis=1)
        d_logits = p * adv[:, None]
        d_logits[rows, action] -= adv
        if entropy_coef != 0:
            d_logits += entropy_coef * p * (logp + entropy[:, None])
        d_logits *= scale[:, None]
        d_v = np.zeros((len(values), 1), np.float32)
        d_v[:t_max * n, 0] = 2.0 * value_coef * scale * (v - returns)
        np.matmul(d_logits.T, acts[-1][:t_max * n], out=pgw)
        np.sum(d_logits, axis=0, out=pgb)
        np.matmul(d_v.T, vacts[-1], out=vgw)
        np.sum(d_v, axis=0, out=vgb)
        d_torso = np.zeros_like(acts[-1])
        d_torso[:t_max * n] = d_logits @ pw
        if self.shared:
            d_torso += d_v @ vw
        else:
            self._backward(self._vtrunk, vacts, d_v @ vw)
        self._backward(self._trunk, acts, d_torso)
        if not metrics:
            return {}
        mean = lambda x: float((x * valid).sum() / count)  # noqa: E731
        policy_loss = -mean(logp[rows, action] * adv)
        value_loss = mean((returns - v) ** 2)
        ent = mean(entropy)
        return {"loss": loss_scale * (policy_loss + value_coef * value_loss - entropy_coef * ent),
                "policy_loss": policy_loss, "value_loss": value_loss, "entropy": ent,
                "value_mean": mean(v), "advantage_abs_mean": mean(np.abs(adv))}
