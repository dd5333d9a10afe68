"""DQN (Mnih et al. 2015) with double-Q targets, n-step returns and an optional dueling
head, on the algorithm contract (`pal_hpc.algos.base`): one update phase, "q".

No MPI, no replay, no environment loop live here.  A learner calls

    metrics, priorities = dqn.compute_gradients("q", batch, out=send)
    allreduce_sum(send, recv)            # the runtime's business, one flat buffer
    dqn.apply_gradients("q", recv, scale=1 / n_learners)

and writes `priorities` back to its replay.  Actors act epsilon-greedy, each actor
decaying to its own final epsilon (Ape-X spread): on vectors and MinAtar's network
through numpy (`pal_hpc.algos.acting.QPolicy`, which an actor rank builds without
torch), on Atari's frames through a CPU copy of the network (`DQNPolicy`).

Vector observations go through an MLP (`hidden`); image observations (uint8 frames,
e.g. Atari) through a CNN torso (`cnn`: Nature or NIPS), kept uint8 up to it.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pal_hpc.algos.base import NetworkPolicy, OnePhaseAlgorithm
from pal_hpc.algos.configs import DQNConfig, DQNSpec
from pal_hpc.algos.acting import QPolicy, actor_epsilon, explore
from pal_hpc.algos.dqn_numpy import NumpyTD
from pal_hpc.algos.nets import (FlatParams, MLPTorso, autocast, is_image, output_linear, seeded,
                                torso)
from pal_hpc.algos.optim import FlatAdam, FlatRMSProp

# The arrays a loss batch carries (see DQN.loss).
BATCH_KEYS = ("obs", "action", "reward", "next_obs", "discount", "weights")


class QNetwork(nn.Module):
    """One Q-value per action, from a torso: an MLP of `hidden` widths on a flattened
    float observation (`obs` is its length, or a vector space), or a CNN torso of kind
    `cnn` on uint8 frames (`obs` an image space, see `nets.is_image`).

    With `dueling=True` the torso's features feed a value head and an advantage
    head, combined as V + A - mean(A) (Wang et al. 2016)."""

    def __init__(self, obs: int | gym.Space, n_actions: int,
                 hidden: Sequence[int] = (256, 256), dueling: bool = False,
                 cnn: str = "nature"):
        super().__init__()
        self.trunk = (MLPTorso(obs, hidden) if isinstance(obs, int)
                      else torso(obs, cnn, hidden))
        self.image = not isinstance(self.trunk, MLPTorso)
        self._linears = ([] if self.image else
                         [m for m in self.trunk if isinstance(m, nn.Linear)])
        width = self.trunk.out_features
        self.dueling = dueling
        if dueling:
            self.value = nn.Linear(width, 1)
            self.advantage = nn.Linear(width, n_actions)
        else:
            self.head = nn.Linear(width, n_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values (B, n_actions) for observations (B, *obs_shape): float32 vectors,
        or uint8 frames for a CNN torso."""
        if self.image:
            z = self.trunk(obs)
        else:
            z = obs.reshape(obs.shape[0], -1)
            # The trunk's layers called functionally: nn.Module's call machinery costs
            # about a tenth of a small network's forward pass.
            for layer in self._linears:
                z = torch.relu(F.linear(z, layer.weight, layer.bias))
        # The heads in fp32 under bf16 autocast too (`nets.output_linear`: bf16 Q-values
        # are coarser than the action gaps).
        if not self.dueling:
            return output_linear(z, self.head.weight, self.head.bias)
        adv = output_linear(z, self.advantage.weight, self.advantage.bias)
        value = output_linear(z, self.value.weight, self.value.bias)
        return value + adv - adv.mean(dim=1, keepdim=True)


def epsilon_greedy(q_net: QNetwork, obs: torch.Tensor, epsilons, n_actions: int,
                   rng: np.random.Generator) -> np.ndarray:
    """Epsilon-greedy actions (B,) int64, one forward pass; row i acts uniformly at
    random with probability epsilons[i] (a scalar broadcasts)."""
    with torch.no_grad():
        actions = q_net(obs).argmax(dim=1).cpu().numpy().astype(np.int64)
    return explore(actions, epsilons, n_actions, rng)


class DQNPolicy(NetworkPolicy):
    """An actor's copy of an Atari CNN Q-network (frames, uint8 up to the torso, which
    scales them), acting epsilon-greedy with this actor's epsilon.  Vector observations
    and MinAtar's network act through numpy (`pal_hpc.algos.acting.QPolicy`)."""

    def __init__(self, q_net: QNetwork, cfg: DQNConfig, n_actions: int, actor_index: int,
                 n_actors: int):
        self.q_net, self.cfg, self.n_actions = q_net, cfg, n_actions
        self.actor_index, self.n_actors = actor_index, n_actors
        super().__init__(q_net)

    def act(self, obs, rng, global_steps, deterministic=False):
        eps = 0.0 if deterministic else actor_epsilon(self.cfg, self.actor_index,
                                                      self.n_actors, global_steps)
        return epsilon_greedy(self.q_net, torch.as_tensor(obs), eps, self.n_actions, rng)


class DQN(DQNSpec, OnePhaseAlgorithm):
    """Online and target Q-networks with an Adam optimizer, on one flat buffer.

    The batch's `reward` is already the n-step discounted return and its `discount`
    is gamma**k for the bootstrap (0 after a terminal): the actors built them."""

    phase = "q"
    def __init__(self, obs_space: gym.Space, act_space: gym.Space, config: DQNConfig | None = None,
                 *, device: str | torch.device = "cpu", seed: int = 0):
        config = config or DQNConfig()
        super().__init__(obs_space, act_space, config, device=device, seed=seed)
        self.obs_shape = tuple(obs_space.shape)
        self.image = is_image(obs_space)
        self.n_actions = int(act_space.n)
        self.double_q = config.double_q
        self.grad_clip = config.grad_clip
        self.target_update = config.target_update
        self.device = torch.device(device)
        self.online = seeded(seed, self._network)
        self.online.to(self.device)
        self.target = copy.deepcopy(self.online).requires_grad_(False)
        # Every parameter (and its .grad) is a view into one flat buffer, so the
        # gradient leaves for the Allreduce without a gather, comes back with one copy,
        # is clipped with one norm and is stepped by one optimizer over the whole
        # vector (FlatAdam, fused, or FlatRMSProp: both elementwise, so this is the same
        # maths as per tensor, without per-tensor bookkeeping).
        self._params = FlatParams([self.online], self.device)
        self._flat, self._flat_grad = self._params.flat, self._params.grad
        if config.optimizer == "rmsprop":        # torch.optim.RMSprop(centered=True)'s
            self.optimizer = FlatRMSProp(self._flat, lr=config.lr, decay=config.rms_decay,
                                         eps=config.rms_eps, eps_in_sqrt=False,
                                         initial_square=0.0, centered=True)
        else:
            self.optimizer = FlatAdam(self._flat, lr=config.lr, eps=config.adam_eps)
        self.updates = 0
        # Small networks on the CPU take their loss gradient through numpy (dqn_numpy.py:
        # autograd's fixed cost per op is most of their update).
        self._np_td = (NumpyTD(self.online, self.target, double_q=self.double_q,
                               loss=config.loss)
                       if NumpyTD.fits(self.online, self.device, config.precision) else None)

    def _network(self) -> QNetwork:
        return QNetwork(self.obs_space, self.n_actions, tuple(self.config.hidden),
                        self.config.dueling, self.config.cnn)

    # ---- acting ---------------------------------------------------------------------

    def make_policy(self, actor_index: int, n_actors: int) -> QPolicy | DQNPolicy:
        """Vector observations: the numpy policy an actor rank without torch runs too
        (`DQNSpec.numpy_policy`); frames: a CPU copy of the online network."""
        if self.numpy_policy(self.obs_space, self.act_space, self.config, 0, 1) is not None:
            return super().make_policy(actor_index, n_actors)
        net = copy.deepcopy(self.online).cpu().requires_grad_(False)
        return DQNPolicy(net, self.config, self.n_actions, actor_index, n_actors)

    def policy_params(self) -> np.ndarray:
        return self.get_flat_params()

    @torch.no_grad()
    def act(self, obs: np.ndarray, epsilons: np.ndarray | float,
            rng: np.random.Generator) -> np.ndarray:
        """Epsilon-greedy actions of the online network (see `epsilon_greedy`)."""
        return epsilon_greedy(self.online, self._obs(obs), epsilons, self.n_actions, rng)

    # ---- learning ---------------------------------------------------------------------

    def loss(self, batch: dict[str, np.ndarray], metrics: bool = True
             ) -> tuple[torch.Tensor, dict[str, float], np.ndarray]:
        """Importance-weighted TD loss (Huber, or squared error with `loss` mse).

        Returns (scalar loss tensor, metrics {"loss", "q_mean", "td_abs_mean"} --
        empty when `metrics` is False, which saves a few kernels and a sync --
        new priorities |TD error| as float64 (B,))."""
        obs, next_obs = self._obs(batch["obs"]), self._obs(batch["next_obs"])
        action = torch.as_tensor(batch["action"], dtype=torch.int64, device=self.device)
        reward = self._tensor(batch["reward"])
        discount = self._tensor(batch["discount"])
        weights = self._tensor(batch["weights"])

        with autocast(self.device, self.config.precision):
            q_all = self.online(obs)
            with torch.no_grad():
                next_q_target = self.target(next_obs)
                best = self.online(next_obs).argmax(dim=1, keepdim=True) if self.double_q else None
        # The TD error and the loss in float32 whatever the networks' precision.
        q = q_all.float().gather(1, action.unsqueeze(1)).squeeze(1)
        with torch.no_grad():
            next_q_target = next_q_target.float()
            if self.double_q:
                # Double DQN: the online net picks the action, the target net values it.
                next_v = next_q_target.gather(1, best).squeeze(1)
            else:
                next_v = next_q_target.max(dim=1).values
            target = reward + discount * next_v
        td = target - q
        per_row = (F.mse_loss if self.config.loss == "mse" else F.smooth_l1_loss)(
            q, target, reduction="none")
        loss = (weights * per_row).mean()

        td_abs = td.detach().abs()
        stats: dict[str, float] = {}
        if metrics:
            # One device->host transfer for the three numbers (one sync on a GPU).
            values = torch.stack([loss.detach(), q_all.detach().float().mean(), td_abs.mean()]).tolist()
            stats = dict(zip(("loss", "q_mean", "td_abs_mean"), values))
        return loss, stats, td_abs.cpu().numpy().astype(np.float64)

    def compute_gradients(self, phase: str, batch: dict[str, np.ndarray],
                          out: np.ndarray, metrics: bool = False
                          ) -> tuple[dict, np.ndarray]:
        """Backpropagate the loss into `out` (float32, num_params; e.g. straight into an
        Allreduce send buffer); return (metrics incl. "grad_norm" before clipping -- {}
        unless `metrics` --, priorities)."""
        self._check_phase(phase)
        if (not isinstance(out, np.ndarray) or out.dtype != np.float32
                or out.shape != (self.num_params,)):
            raise ValueError(f"out must be float32 of shape ({self.num_params},), got "
                             f"{getattr(out, 'dtype', out)} {getattr(out, 'shape', '')}")
        if self._np_td is not None:          # writes every gradient entry
            stats, priorities = self._np_td(batch, metrics)
        else:
            self._flat_grad.zero_()
            loss, stats, priorities = self.loss(batch, metrics)
            loss.backward()
        if metrics:
            stats["grad_norm"] = torch.linalg.vector_norm(self._flat_grad).item()
        out[...] = self._flat_grad.cpu().numpy()
        return stats, priorities

    def apply_gradients(self, phase: str, flat_grad: np.ndarray, scale: float = 1.0) -> None:
        """Take `flat_grad * scale` as the gradient (scale = 1/learners turns an
        Allreduce sum into the mean), clip its global norm to `grad_clip` (if > 0),
        take one optimizer step, and sync the target every `target_update` updates."""
        self._check_phase(phase)
        flat = torch.as_tensor(np.asarray(flat_grad, dtype=np.float32), device=self.device)
        if flat.numel() != self.num_params:
            raise ValueError(f"gradient has {flat.numel()} entries, expected {self.num_params}")
        if scale == 1.0:
            self._flat_grad.copy_(flat)
        else:
            torch.mul(flat, scale, out=self._flat_grad)
        self.optimizer.step(self._flat_grad, clip_norm=self.grad_clip)
        self.updates += 1
        if self.updates % self.target_update == 0:
            self.sync_target()

    def sync_target(self) -> None:
        """Copy the online weights into the target network."""
        self.target.load_state_dict(self.online.state_dict())

    # ---- parameters and checkpoints ------------------------------------------------------

    def state_arrays(self) -> list[np.ndarray]:
        # The online parameters: the target and the optimizer follow from the same
        # averaged gradients (and the digest stays what earlier runs recorded).
        return [self.get_flat_params()]

    def state_dict(self) -> dict:
        """Online, target and optimizer state, and the update count (target syncs)."""
        return {"online": self.online.state_dict(), "target": self.target.state_dict(),
                "optimizer": self.optimizer.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        """Restore what state_dict() returned."""
        self.online.load_state_dict(state["online"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state.get("updates", self.optimizer.step_count))

    def _tensor(self, x: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(x, dtype=torch.float32, device=self.device)

    def _obs(self, x: np.ndarray) -> torch.Tensor:
        """Observations on the device: frames as uint8 (a quarter of float32's bytes
        to move; the CNN torso scales them), vectors as float32."""
        return self._tensor(x) if not self.image else torch.as_tensor(x, device=self.device)
