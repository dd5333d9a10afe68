"""Adam over one flat parameter vector, with global-norm clipping folded in.

The learner's network is small (CartPole's Q-network has 67k parameters), so a
`torch.optim.Adam` step costs about as much in Python and dispatch overhead
(parameter groups, hooks, per-tensor state) as in arithmetic.  Our parameters
already live in one flat buffer (see `DQN`), so a step is a norm for the clip and
one call of torch's public functional Adam with its fused kernel: one pass over
parameter, gradient and moments.  That pass matters more than the op count: in the
learner's loop the vectors are cache-cold, and an unfused Adam (seven kernels,
kept below for devices without the fused kernel) measured 2.7x slower there.

The update is Adam's (Kingma & Ba, 2015) as torch.optim.Adam computes it, without
weight decay or AMSGrad; tests/test_optim.py checks it against torch.optim.Adam step
by step, on both paths.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch.optim.adam import adam as functional_adam

from pal_hpc.algos._optimcore import rmsprop_step


class FlatAdam:
    """Adam for a single 1-D parameter tensor, updated in place.  `fused` (default:
    on CPU and CUDA) picks torch's fused kernel; False, the seven-kernel update."""

    def __init__(self, param: torch.Tensor, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 fused: bool | None = None):
        if param.dim() != 1:
            raise ValueError(f"FlatAdam needs a 1-D parameter vector, got shape {tuple(param.shape)}")
        if not lr > 0 or not eps > 0 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"bad Adam hyperparameters lr={lr} betas={betas} eps={eps}")
        self.param = param
        self.lr, self.betas, self.eps = float(lr), (float(betas[0]), float(betas[1])), float(eps)
        self.exp_avg = torch.zeros_like(param)
        self.exp_avg_sq = torch.zeros_like(param)
        # The fused kernel reads (and increments) the step count from a float32
        # tensor, as torch.optim.Adam(fused=True) keeps it: exact to 2^24 steps, after
        # which the bias corrections it feeds are 1 to float precision anyway.
        self.fused = fused if fused is not None else param.device.type in ("cpu", "cuda")
        self._step = torch.zeros((), dtype=torch.float32, device=param.device)

    @torch.no_grad()
    def step(self, grad: torch.Tensor, clip_norm: float = 0.0) -> None:
        """One update with `grad` (same shape as the parameter).  With clip_norm > 0
        the gradient is first scaled by min(1, clip_norm / (||grad|| + 1e-6)) -- the
        rule of torch.nn.utils.clip_grad_norm_ -- in place."""
        if clip_norm > 0:
            norm = torch.linalg.vector_norm(grad)
            grad.mul_(torch.clamp(clip_norm / (norm + 1e-6), max=1.0))
        beta1, beta2 = self.betas
        if self.fused:
            functional_adam([self.param], [grad], [self.exp_avg], [self.exp_avg_sq], [],
                            [self._step], fused=True, amsgrad=False, beta1=beta1, beta2=beta2,
                            lr=self.lr, weight_decay=0.0, eps=self.eps, maximize=False)
            return
        self._step += 1
        t = self.step_count
        self.exp_avg.lerp_(grad, 1.0 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
        bias1 = 1.0 - beta1 ** t
        bias2_sqrt = math.sqrt(1.0 - beta2 ** t)
        denom = self.exp_avg_sq.sqrt().div_(bias2_sqrt).add_(self.eps)
        self.param.addcdiv_(self.exp_avg, denom, value=-self.lr / bias1)

    @property
    def step_count(self) -> int:
        """Steps taken so far."""
        return int(self._step.item())

    def state_dict(self) -> dict:
        """Moments, step count and hyperparameters: tensors and numbers only."""
        return {"step": self.step_count, "exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq,
                "lr": self.lr, "beta1": self.betas[0], "beta2": self.betas[1], "eps": self.eps}

    def load_state_dict(self, state: dict) -> None:
        """Restore what state_dict() returned; the moments must match the parameter."""
        missing = [k for k in ("step", "exp_avg", "exp_avg_sq", "lr", "beta1", "beta2", "eps")
                   if k not in state]
        if missing:
            raise ValueError(f"optimizer state lacks {missing} (has {sorted(state)}): not a "
                             f"FlatAdam state -- a checkpoint from before pal_hpc's flat Adam?")
        for key in ("exp_avg", "exp_avg_sq"):
            t = torch.as_tensor(state[key])
            if tuple(t.shape) != tuple(self.param.shape):
                raise ValueError(f"optimizer state {key!r} has shape {tuple(t.shape)}, "
                                 f"the parameter vector {tuple(self.param.shape)}")
        step = int(state["step"])
        if step < 0:
            raise ValueError(f"optimizer state 'step' is negative: {step}")
        self.exp_avg.copy_(torch.as_tensor(state["exp_avg"]))
        self.exp_avg_sq.copy_(torch.as_tensor(state["exp_avg_sq"]))
        self._step.fill_(step)
        self.lr = float(state["lr"])
        self.betas = (float(state["beta1"]), float(state["beta2"]))
        self.eps = float(state["eps"])


class FlatRMSProp:
    """RMSProp for a single 1-D parameter tensor, updated in place, with global-norm
    clipping folded in (as `FlatAdam`).

    By default the update is that of TensorFlow 1's `RMSPropOptimizer`, which PAAC's
    released code used with decay 0.99 and epsilon 0.1 (and which its learning rate
    0.0224 was tuned for): the mean square starts at 1 and epsilon sits inside the
    square root,

        ms <- decay * ms + (1 - decay) * g^2;   p <- p - lr * g / sqrt(ms + eps).

    `eps_in_sqrt=False, initial_square=0.0` is torch.optim.RMSprop's update instead,
    p <- p - lr * g / (sqrt(ms) + eps) from ms = 0 (tests/test_paac.py checks it
    against torch step by step).  `centered=True` (with those two) is
    torch.optim.RMSprop(centered=True), the centered RMSProp of the MinAtar paper's DQN:
    a running mean of the gradient `ga` too, and p <- p - lr * g / (sqrt(ms - ga^2) + eps).
    `step` takes the learning rate of this step, so a caller can anneal it."""

    def __init__(self, param: torch.Tensor, lr: float = 1e-2, decay: float = 0.99,
                 eps: float = 0.1, eps_in_sqrt: bool = True, initial_square: float = 1.0,
                 centered: bool = False):
        if param.dim() != 1:
            raise ValueError(f"FlatRMSProp needs a 1-D parameter vector, got shape "
                             f"{tuple(param.shape)}")
        if not lr >= 0 or not eps > 0 or not 0.0 <= decay < 1.0 or not initial_square >= 0:
            raise ValueError(f"bad RMSProp hyperparameters lr={lr} decay={decay} eps={eps} "
                             f"initial_square={initial_square}")
        self.param = param
        self.lr, self.decay, self.eps = float(lr), float(decay), float(eps)
        self.eps_in_sqrt = bool(eps_in_sqrt)
        self.square_avg = torch.full_like(param, float(initial_square))
        self.centered = bool(centered)
        self.grad_avg = torch.zeros_like(param) if self.centered else None
        self.steps = 0
        self._fused = (param.device.type == "cpu" and param.dtype == torch.float32
                       and param.is_contiguous())
        self._grad_avg_np = (self.grad_avg.detach().numpy() if self.centered and self._fused
                             else np.zeros(0, np.float32))

    @torch.no_grad()
    def step(self, grad: torch.Tensor, clip_norm: float = 0.0, lr: float | None = None) -> float:
        """One update with `grad` (same shape as the parameter) at learning rate `lr`
        (default: the constructor's).  With clip_norm > 0 the gradient is first scaled
        by min(1, clip_norm / (||grad|| + 1e-6)) in place, as torch's
        clip_grad_norm_.  Returns the gradient's norm before clipping (0.0 when not
        clipping: then it is not computed)."""
        norm = 0.0
        if clip_norm > 0:
            n = torch.linalg.vector_norm(grad)
            grad.mul_(torch.clamp(clip_norm / (n + 1e-6), max=1.0))
            norm = float(n)
        lr = self.lr if lr is None else float(lr)
        if self._fused:
            # One pass over the vector on the CPU (cython/optimcore.pyx): the ops below,
            # in the same order, agreeing with them to float32 rounding.
            rmsprop_step(self.param.detach().numpy(),
                         grad.detach().to(torch.float32).contiguous().numpy(),
                         self.square_avg.numpy(), self._grad_avg_np, lr, self.decay,
                         self.eps, self.eps_in_sqrt, self.centered)
            self.steps += 1
            return norm
        self.square_avg.mul_(self.decay).addcmul_(grad, grad, value=1.0 - self.decay)
        if self.centered:
            self.grad_avg.lerp_(grad, 1.0 - self.decay)
            var = self.square_avg.addcmul(self.grad_avg, self.grad_avg, value=-1.0)
        else:
            var = self.square_avg
        if self.eps_in_sqrt:
            denom = var.add(self.eps).sqrt_()
        else:
            denom = var.sqrt().add_(self.eps)
        self.param.addcdiv_(grad, denom, value=-lr)
        self.steps += 1
        return norm

    @property
    def step_count(self) -> int:
        """Steps taken so far."""
        return self.steps

    def state_dict(self) -> dict:
        """Mean squares (and, centered, mean gradients), step count and hyperparameters:
        tensors and numbers only.  An uncentered state has the keys it always had."""
        state = {"steps": self.steps, "square_avg": self.square_avg, "lr": self.lr,
                 "decay": self.decay, "eps": self.eps, "eps_in_sqrt": self.eps_in_sqrt}
        if self.centered:
            state.update(centered=True, grad_avg=self.grad_avg)
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore what state_dict() returned; the mean squares must match the parameter."""
        missing = [k for k in ("steps", "square_avg", "lr", "decay", "eps", "eps_in_sqrt")
                   if k not in state]
        if missing:
            raise ValueError(f"optimizer state lacks {missing} (has {sorted(state)}): not a "
                             f"FlatRMSProp state")
        if bool(state.get("centered", False)) != self.centered:
            raise ValueError(f"optimizer state is {'' if state.get('centered') else 'not '}"
                             f"centered, this RMSProp is{'' if self.centered else ' not'}")
        for key in ("square_avg", "grad_avg") if self.centered else ("square_avg",):
            t = torch.as_tensor(state[key])
            if tuple(t.shape) != tuple(self.param.shape):
                raise ValueError(f"optimizer state {key!r} has shape {tuple(t.shape)}, "
                                 f"the parameter vector {tuple(self.param.shape)}")
            getattr(self, key).copy_(t)
        self.steps = int(state["steps"])
        self.lr, self.decay, self.eps = float(state["lr"]), float(state["decay"]), float(state["eps"])
        self.eps_in_sqrt = bool(state["eps_in_sqrt"])
