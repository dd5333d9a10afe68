"""DQN maths: the Q-network, the (double) n-step TD loss, and a gradient step split in two.

No MPI, no replay, no environment loop live here.  A learner calls

    grad, metrics, priorities = dqn.compute_gradients(batch, out=send)
    allreduce_sum(send, recv)            # the runtime's business, one flat buffer
    dqn.apply_gradients(recv, scale=1 / n_learners)

and writes `priorities` back to its replay, so one generic learner loop serves every
algorithm whose loss returns metrics and new priorities (the Acme shape).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pal_hpc.algos.optim import FlatAdam

# The arrays a loss batch carries (see DQN.loss).
BATCH_KEYS = ("obs", "action", "reward", "next_obs", "discount", "weights")


class QNetwork(nn.Module):
    """MLP from a flattened float observation to one Q-value per action.

    With `dueling=True` the last hidden layer feeds a value head and an advantage
    head, combined as V + A - mean(A) (Wang et al. 2016)."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: Sequence[int] = (256, 256),
                 dueling: bool = False):
        super().__init__()
        layers: list[nn.Module] = []
        width = obs_dim
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        self.trunk = nn.Sequential(*layers)
        self._linears = [m for m in layers if isinstance(m, nn.Linear)]
        self.dueling = dueling
        if dueling:
            self.value = nn.Linear(width, 1)
            self.advantage = nn.Linear(width, n_actions)
        else:
            self.head = nn.Linear(width, n_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values (B, n_actions) for observations (B, *obs_shape)."""
        z = obs.reshape(obs.shape[0], -1)
        # The trunk's layers called functionally: nn.Module's call machinery costs
        # about a tenth of a small network's forward pass.
        for layer in self._linears:
            z = torch.relu(F.linear(z, layer.weight, layer.bias))
        if not self.dueling:
            return F.linear(z, self.head.weight, self.head.bias)
        adv = self.advantage(z)
        return self.value(z) + adv - adv.mean(dim=1, keepdim=True)


class DQN:
    """Online and target Q-networks with an Adam optimizer.

    The batch's `reward` is already the n-step discounted return and its `discount`
    is gamma**k for the bootstrap (0 after a terminal), so `n_step` and `gamma` are
    kept here only for the code that builds those transitions."""

    def __init__(self, obs_shape: tuple, n_actions: int, *, hidden: Sequence[int] = (256, 256),
                 dueling: bool = False, double_q: bool = True, gamma: float = 0.99,
                 n_step: int = 3, lr: float = 1e-3, grad_clip: float = 10.0,
                 device: str | torch.device = "cpu", seed: int = 0):
        self.obs_shape = tuple(obs_shape)
        self.n_actions = int(n_actions)
        self.double_q = double_q
        self.gamma = gamma
        self.n_step = n_step
        self.grad_clip = grad_clip
        self.device = torch.device(device)
        # Seed a forked RNG so the init is reproducible without touching the caller's
        # global torch RNG state.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.online = QNetwork(math.prod(self.obs_shape), self.n_actions, hidden, dueling)
        self.online.to(self.device)
        self.target = copy.deepcopy(self.online).requires_grad_(False)
        self.params = list(self.online.parameters())
        # Every parameter (and its .grad) is a view into one flat buffer, so the
        # gradient leaves for the Allreduce without a gather, comes back with one copy,
        # is clipped with one norm and is stepped by one fused Adam over the whole
        # vector (FlatAdam: Adam is elementwise, so this is the same maths as Adam per
        # tensor, without per-tensor bookkeeping).  Never set the grads to None.
        n = sum(p.numel() for p in self.params)
        self._flat = torch.empty(n, device=self.device)
        self._flat_grad = torch.zeros(n, device=self.device)
        offset = 0
        for p in self.params:
            k = p.numel()
            self._flat[offset:offset + k].copy_(p.data.reshape(-1))
            p.data = self._flat[offset:offset + k].view_as(p)
            p.grad = self._flat_grad[offset:offset + k].view_as(p)
            offset += k
        self.optimizer = FlatAdam(self._flat, lr=lr)

    # ---- acting ---------------------------------------------------------------------

    @torch.no_grad()
    def act(self, obs: np.ndarray, epsilons: np.ndarray | float,
            rng: np.random.Generator) -> np.ndarray:
        """Epsilon-greedy actions (B,) int64 for a batch of observations, one forward
        pass; row i acts uniformly at random with probability epsilons[i]."""
        q = self.online(self._tensor(obs))
        actions = q.argmax(dim=1).cpu().numpy().astype(np.int64)
        eps = np.broadcast_to(np.asarray(epsilons, dtype=np.float64), actions.shape)
        explore = rng.random(actions.shape) < eps
        actions[explore] = rng.integers(0, self.n_actions, size=int(explore.sum()))
        return actions

    # ---- learning ---------------------------------------------------------------------

    def loss(self, batch: dict[str, np.ndarray], metrics: bool = True
             ) -> tuple[torch.Tensor, dict[str, float], np.ndarray]:
        """Importance-weighted Huber TD loss.

        Returns (scalar loss tensor, metrics {"loss", "q_mean", "td_abs_mean"} --
        empty when `metrics` is False, which saves a few kernels and a sync --
        new priorities |TD error| as float64 (B,))."""
        obs, next_obs = self._tensor(batch["obs"]), self._tensor(batch["next_obs"])
        action = torch.as_tensor(batch["action"], dtype=torch.int64, device=self.device)
        reward = self._tensor(batch["reward"])
        discount = self._tensor(batch["discount"])
        weights = self._tensor(batch["weights"])

        q_all = self.online(obs)
        q = q_all.gather(1, action.unsqueeze(1)).squeeze(1)
        with torch.no_grad():
            next_q_target = self.target(next_obs)
            if self.double_q:
                # Double DQN: the online net picks the action, the target net values it.
                best = self.online(next_obs).argmax(dim=1, keepdim=True)
                next_v = next_q_target.gather(1, best).squeeze(1)
            else:
                next_v = next_q_target.max(dim=1).values
            target = reward + discount * next_v
        td = target - q
        loss = (weights * F.smooth_l1_loss(q, target, reduction="none")).mean()

        td_abs = td.detach().abs()
        stats: dict[str, float] = {}
        if metrics:
            # One device->host transfer for the three numbers (one sync on a GPU).
            values = torch.stack([loss.detach(), q_all.detach().mean(), td_abs.mean()]).tolist()
            stats = dict(zip(("loss", "q_mean", "td_abs_mean"), values))
        return loss, stats, td_abs.cpu().numpy().astype(np.float64)

    def compute_gradients(self, batch: dict[str, np.ndarray], out: np.ndarray | None = None,
                          metrics: bool = True) -> tuple[np.ndarray, dict, np.ndarray]:
        """Backpropagate the loss; return (flat float32 gradient in parameter order,
        metrics incl. "grad_norm" before clipping -- {} if `metrics` is False --,
        priorities).  The gradient is written into `out` (float32, num_params) when
        given -- e.g. straight into an Allreduce send buffer -- and is a fresh copy
        otherwise."""
        if out is not None and (out.dtype != np.float32 or out.shape != (self.num_params,)):
            raise ValueError(f"out must be float32 of shape ({self.num_params},), "
                             f"got {out.dtype} {out.shape}")
        self._flat_grad.zero_()
        loss, stats, priorities = self.loss(batch, metrics)
        loss.backward()
        if metrics:
            stats["grad_norm"] = torch.linalg.vector_norm(self._flat_grad).item()
        grad = self._flat_grad.cpu().numpy()
        if out is None:
            return grad.copy(), stats, priorities
        out[...] = grad
        return out, stats, priorities

    def apply_gradients(self, flat_grad: np.ndarray, scale: float = 1.0) -> None:
        """Take `flat_grad * scale` as the gradient (scale = 1/learners turns an
        Allreduce sum into the mean), clip its global norm to `grad_clip` (if > 0)
        and take one optimizer step.  One pass into the gradient buffer."""
        flat = torch.as_tensor(np.asarray(flat_grad, dtype=np.float32), device=self.device)
        if flat.numel() != self.num_params:
            raise ValueError(f"gradient has {flat.numel()} entries, expected {self.num_params}")
        if scale == 1.0:
            self._flat_grad.copy_(flat)
        else:
            torch.mul(flat, scale, out=self._flat_grad)
        self.optimizer.step(self._flat_grad, clip_norm=self.grad_clip)

    def sync_target(self) -> None:
        """Copy the online weights into the target network."""
        self.target.load_state_dict(self.online.state_dict())

    # ---- parameters and checkpoints ------------------------------------------------------

    @property
    def num_params(self) -> int:
        """Number of scalars in the online network (the length of a flat vector)."""
        return self._flat.numel()

    def get_flat_params(self) -> np.ndarray:
        """Online-network parameters as one float32 vector (a copy), in parameter order."""
        return self._flat.detach().cpu().numpy().astype(np.float32, copy=True)

    @torch.no_grad()
    def set_flat_params(self, flat: np.ndarray) -> None:
        """Load online-network parameters from a vector laid out as get_flat_params'."""
        flat_t = torch.as_tensor(np.asarray(flat, dtype=np.float32), device=self.device)
        if flat_t.numel() != self.num_params:
            raise ValueError(f"vector has {flat_t.numel()} entries, expected {self.num_params}")
        # A copy into our buffer: never alias the caller's numpy memory.
        self._flat.copy_(flat_t)

    def state_dict(self) -> dict:
        """Online, target and optimizer state: nested dicts of tensors and numbers."""
        return {"online": self.online.state_dict(), "target": self.target.state_dict(),
                "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore what state_dict() returned."""
        self.online.load_state_dict(state["online"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])

    def _tensor(self, x: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(x, dtype=torch.float32, device=self.device)
