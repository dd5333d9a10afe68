"""DQN's TD loss and its gradient for small networks, by hand in numpy on the CPU.

A learner update of DQN on a MinAtar game (batch 32, the paper's one convolution of 16
3x3 filters and a dense layer of 128) is about 20 MFLOP, yet autograd took 1.7 ms of the
2.1 ms update (`bench/profile_learner.py --minatar Breakout`, Zen 4, one thread): the
forward passes, the backward and the conv's oneDNN kernels are dominated by torch's fixed
cost per op, not by the arithmetic.  At the paper's one update per frame, 5M frames is
5M updates.  The same holds for an MLP on a vector observation (CartPole's [256, 256]
at batch 64: 1.0 ms).  `NumpyTD` computes the loss of `DQN.loss` and its gradient with
the chain rule written out, into views of the online network's gradient buffers (the
flat buffer the Allreduce sends).

Networks it takes (`NumpyTD.fits`): an MLP torso (ReLU) or the MinAtar CNN torso (one
unpadded convolution and a dense layer, ReLU after each) on the CPU in fp32, with the
plain or the dueling head; double-Q, Huber or squared loss and importance weights as
`DQN.loss`.  Frames of the Atari torsos, GPUs and bf16 stay on autograd.

With q_i = Q(s_i, a_i), y_i the target (no gradient through it), d_i = y_i - q_i and
w_i the importance weights, the loss is mean_i w_i l(d_i) with l the Huber loss
(0.5 d^2 for |d| < 1, |d| - 0.5 beyond) or d^2, so

    dL/dQ(s_i, a) = -w_i clip(d_i, -1, 1) / B   (Huber)  or  -2 w_i d_i / B   (mse)

at a = a_i and 0 at the other actions.  A dueling head Q = V + A - mean(A) passes
dL/dV = sum_a dL/dQ(s, a) and dL/dA_a = dL/dQ(s, a) - dL/dV / n_actions.  The
convolution and its weight gradient run in C straight from the uint8 frames
(`pal_hpc.algos._convcore`, cython/conv_core.h: the 16 filters in the CPU's vectors, a
row's sums in registers; 2-3x numpy's patches and per-frame products), its output already in the
order torch's Flatten gives the dense layer.  The values agree with autograd's to float32
rounding (tests/test_dqn.py), not bit for bit: a run's numbers are those of this path
wherever it fits, on every learner alike.
"""

from __future__ import annotations

import numpy as np
from torch import nn

from pal_hpc.algos._convcore import conv_relu, conv_weight_grad
from pal_hpc.algos.cnn import CNNTorso


def _view(m: nn.Module, grad: bool = True):
    """(W, b) as numpy views of a layer's parameters, and (dW, db) of its gradients; a
    convolution's W and dW as (out_channels, in_channels * kh * kw)."""
    w, b = m.weight.detach(), m.bias.detach()
    out = [w.reshape(w.shape[0], -1).numpy(), b.numpy()]
    if grad:
        out += [m.weight.grad.reshape(w.shape[0], -1).numpy(), m.bias.grad.numpy()]
    return tuple(out)


class NumpyTD:
    """Forward passes of an online and a target `QNetwork` and the online network's
    TD-loss gradient, in numpy, from views of their parameters."""

    def __init__(self, online, target, *, double_q: bool, loss: str):
        self.online, self.target = online, target
        self.double_q = bool(double_q)
        self.huber = loss != "mse"
        self.dueling = online.dueling
        self.conv = None
        if online.image:
            conv = online.trunk.body[0]
            c, h, w = online.trunk.in_shape
            k, s = conv.kernel_size[0], conv.stride[0]
            oh, ow = (h - k) // s + 1, (w - k) // s + 1
            self.conv = conv
            self.k, self.s = k, s
            self.frame_shape = (c, h, w)
            self.out_shape = (conv.out_channels, oh * ow)
        # A parameter of each network, to see if their storage moved (walking the
        # modules each update cost 40 us).
        self._first = (next(online.parameters()), next(target.parameters()))
        self._ptr = None

    @classmethod
    def fits(cls, net, device, precision: str) -> bool:
        """Whether `net` (a QNetwork) on `device` at that precision takes this path."""
        if device.type != "cpu" or precision != "fp32":
            return False
        if not net.image:
            return all(isinstance(m, (nn.Linear, nn.ReLU)) for m in net.trunk)
        body = list(net.trunk.body) if isinstance(net.trunk, CNNTorso) else []
        kinds = [type(m) for m in body]
        return (kinds == [nn.Conv2d, nn.ReLU, nn.Flatten, nn.Linear, nn.ReLU]
                and body[0].padding == (0, 0) and body[0].dilation == (1, 1)
                and body[0].groups == 1 and body[0].kernel_size[0] == body[0].kernel_size[1]
                and body[0].stride[0] == body[0].stride[1])

    # ---- views --------------------------------------------------------------------------

    def _layers(self, net, grad: bool):
        """[(W, b[, dW, db]) per torso layer, conv first], [(W, b[, ...]) per head]."""
        if net.image:
            torso = [_view(net.trunk.body[0], grad), _view(net.trunk.body[3], grad)]
        else:
            torso = [_view(m, grad) for m in net.trunk if isinstance(m, nn.Linear)]
        heads = (net.value, net.advantage) if net.dueling else (net.head,)
        return torso, [_view(m, grad) for m in heads]

    def _views(self) -> None:
        """Rebuilt if a parameter's storage moved (the online network's are views of
        one flat buffer for its life, the target's are copied into in place)."""
        ptr = (self._first[0].data_ptr(), self._first[1].data_ptr())
        if ptr != self._ptr:
            self._online = self._layers(self.online, True)
            self._target = self._layers(self.target, False)
            self._ptr = ptr

    # ---- forward and backward ----------------------------------------------------------------

    def _frames(self, obs) -> np.ndarray:
        """The batch's frames as C-contiguous uint8 (B, C, H, W) (bool frames as 0/1)."""
        x = np.asarray(obs)
        if x.dtype == np.bool_:
            x = x.view(np.uint8)
        return np.ascontiguousarray(x, dtype=np.uint8).reshape(len(x), *self.frame_shape)

    def _forward(self, layers, obs: np.ndarray):
        """Q-values (B, n_actions) and the activations the backward needs."""
        torso, heads = layers
        acts = []
        if self.conv is not None:
            w, b = torso[0][:2]
            frames = self._frames(obs)
            h = np.empty((len(frames), *self.out_shape), np.float32)
            conv_relu(frames, np.ascontiguousarray(w.T), b, self.k, self.s, h)
            acts = [frames, h]                         # h: (B, out_channels, positions)
            z = h.reshape(len(h), -1)                  # torch's Flatten order
            dense = torso[1:]
        else:
            z = np.asarray(obs, np.float32).reshape(len(obs), -1)
            acts = [z]
            dense = torso
        for w, b, *_ in dense:
            z = (w @ z.T).T            # (out, in) @ (in, B): OpenBLAS's faster shape here
            z += b
            np.maximum(z, 0.0, out=z)
            acts.append(z)
        outs = [z @ w.T + b for w, b, *_ in heads]
        if not self.dueling:
            return outs[0], acts
        value, adv = outs
        return value + adv - adv.mean(axis=1, keepdims=True), acts

    def _backward(self, acts, d_q: np.ndarray) -> None:
        """Backpropagate dL/dQ (B, n_actions) into the online network's gradients."""
        torso, heads = self._online
        z = acts[-1]
        if self.dueling:
            d_v = d_q.sum(axis=1, keepdims=True)
            d_heads = (d_v, d_q - d_v / d_q.shape[1])
        else:
            d_heads = (d_q,)
        delta = None
        for (w, _, gw, gb), d in zip(heads, d_heads):
            np.matmul(d.T, z, out=gw)
            np.sum(d, axis=0, out=gb)
            delta = d @ w if delta is None else delta + d @ w
        dense = torso[1:] if self.conv is not None else torso
        first = 2 if self.conv is not None else 1     # acts index of dense[0]'s output
        for i in range(len(dense) - 1, -1, -1):
            w, _, gw, gb = dense[i]
            delta *= acts[first + i] > 0
            inp = acts[first + i - 1]
            np.matmul(delta.T, inp.reshape(len(inp), -1), out=gw)
            np.sum(delta, axis=0, out=gb)
            if i or self.conv is not None:
                delta = delta @ w
        if self.conv is not None:
            frames, h = acts[0], acts[1]
            _, _, gw, gb = torso[0]
            d_h = delta.reshape(h.shape)
            d_h *= h > 0
            # dW[o, j] = sum over frames b and positions p of d_h[b, o, p] patch_j[b, p]
            gw_t = np.empty(gw.shape[::-1], np.float32)
            conv_weight_grad(frames, d_h, self.k, self.s, gw_t, gb)
            gw[...] = gw_t.T

    def __call__(self, batch, metrics: bool):
        """Write the TD loss's gradient into the online network's gradient buffers;
        return (metrics as `DQN.loss` -- {} unless `metrics` --, |TD error| float64)."""
        self._views()
        obs, next_obs = batch["obs"], batch["next_obs"]
        action = np.asarray(batch["action"], np.int64).reshape(-1)
        rows = np.arange(len(action))
        q_all, acts = self._forward(self._online, obs)
        next_target, _ = self._forward(self._target, next_obs)
        if self.double_q:
            best = self._forward(self._online, next_obs)[0].argmax(axis=1)
            next_v = next_target[rows, best]
        else:
            next_v = next_target.max(axis=1)
        target = (np.asarray(batch["reward"], np.float32)
                  + np.asarray(batch["discount"], np.float32) * next_v)
        q = q_all[rows, action]
        td = target - q
        weights = np.asarray(batch["weights"], np.float32)
        n = np.float32(len(action))
        d_q = np.zeros_like(q_all)
        if self.huber:
            d_q[rows, action] = -weights * np.clip(td, -1.0, 1.0) / n
        else:
            d_q[rows, action] = -2.0 * weights * td / n
        self._backward(acts, d_q)
        td_abs = np.abs(td)
        stats: dict[str, float] = {}
        if metrics:
            if self.huber:
                per_row = np.where(td_abs < 1.0, 0.5 * td * td, td_abs - 0.5)
            else:
                per_row = td * td
            stats = {"loss": float((weights * per_row).mean()), "q_mean": float(q_all.mean()),
                     "td_abs_mean": float(td_abs.mean())}
        return stats, td_abs.astype(np.float64)
