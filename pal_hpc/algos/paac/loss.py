"""PAAC's loss: the round's rollout (its layout), its n-step returns, and the advantage
actor-critic loss over the valid steps.

A round is t_max steps of n_e environments.  The master that drives them (see
`pal_hpc.runtime.onpolicy`) hands `PAAC.compute_gradients` the round's rollout:

    obs         (t_max + 1, n_e, *obs_shape)   s_0 .. s_{t_max}
    action      (t_max, n_e) int64
    reward      (t_max, n_e) float32
    terminated  (t_max, n_e) bool
    truncated   (t_max, n_e) bool
    valid       (t_max, n_e) bool   False on the reset step after an episode's end

The environments reset on the step after an episode ends (gymnasium's next-step
autoreset): on that step the action is ignored, the reward is 0 and the observation
is the new episode's first.  It is no transition, so it is masked out of the loss
(`valid`).  Returns are n-step: R_t = r_t + gamma R_{t+1}, bootstrapped from
V(s_{t_max}), cut to r_t at a termination and to r_t + gamma V(s_{t+1}) at a
truncation (with next-step autoreset, s_{t+1} is then the episode's last
observation).  The loss is the advantage actor-critic one with an entropy bonus,

    -mean(log pi(a_t|s_t) (R_t - V(s_t))) + value_coef mean((R_t - V(s_t))^2)
        - entropy mean(H(pi(.|s_t)))

over the valid steps, times loss_scale.
"""

from __future__ import annotations

import numpy as np
import torch

BATCH_KEYS = ("obs", "action", "reward", "terminated", "truncated", "valid")


def check_batch(batch: dict[str, np.ndarray]) -> None:
    """Raise KeyError naming the rollout's keys that `batch` lacks."""
    missing = [k for k in BATCH_KEYS if k not in batch]
    if missing:
        raise KeyError(f"paac batch lacks {missing}")


def nstep_returns(rewards: np.ndarray, values: np.ndarray, terminated: np.ndarray,
                  truncated: np.ndarray, gamma: float) -> np.ndarray:
    """n-step returns (T, N) of one round.

    `values` (T + 1, N) are V(s_0) .. V(s_T).  Backwards from R_T = V(s_T):
    R_t = r_t + gamma * R_{t+1}, except at an episode's last step t, where the
    bootstrap is 0 (terminated) or V(s_{t+1}) (truncated: s_{t+1} is the episode's
    last observation under next-step autoreset).  The return of a reset step (the step
    after an episode's end) is meaningless and must be masked by the caller; no valid
    step ever bootstraps from it."""
    rewards = np.asarray(rewards, np.float64)
    values = np.asarray(values, np.float64)
    t_max = rewards.shape[0]
    if values.shape != (t_max + 1, *rewards.shape[1:]):
        raise ValueError(f"values: shape {values.shape}, expected {(t_max + 1, *rewards.shape[1:])}")
    out = np.empty_like(rewards)
    ret = values[t_max]
    for t in range(t_max - 1, -1, -1):
        nxt = np.where(terminated[t], 0.0, np.where(truncated[t], values[t + 1], ret))
        ret = rewards[t] + gamma * nxt
        out[t] = ret
    return out



def actor_critic_loss(logits: torch.Tensor, values: torch.Tensor,
                      batch: dict[str, np.ndarray], *, gamma: float, clip_rewards: bool,
                      loss_scale: float, value_coef: float, entropy_coef: float,
                      metrics: bool = True) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of one round (see the module docstring) from the network's `logits`
    (t_max + 1, n_e, n_actions) and `values` (t_max + 1, n_e) on the round's
    observations, and, when `metrics`, its parts."""
    t_max, n = np.shape(batch["reward"])
    device = values.device
    logits = logits[:t_max]
    rewards = np.asarray(batch["reward"], np.float64)
    if clip_rewards:
        rewards = np.clip(rewards, -1.0, 1.0)
    returns = torch.as_tensor(
        nstep_returns(rewards, values.detach().cpu().numpy(), batch["terminated"],
                      batch["truncated"], gamma), dtype=torch.float32, device=device)
    valid = np.asarray(batch["valid"])
    # Rounds without a reset step (most) skip the mask, and a zero entropy weight skips
    # the entropy: x * 1.0 and y - 0.0 * H are exact, so the loss is the same to the
    # bit; each skipped op saves its forward and backward (torch's cost per op is most
    # of a small network's update).
    mask = None if valid.all() else torch.as_tensor(valid, dtype=torch.float32,
                                                      device=device)
    count = float(max(valid.sum(), 1))
    v = values[:t_max]
    adv = returns - v.detach()
    log_probs = torch.log_softmax(logits, dim=-1)
    action = torch.as_tensor(np.asarray(batch["action"]), dtype=torch.int64, device=device)
    log_pi = log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1)

    def masked_mean(x: torch.Tensor) -> torch.Tensor:
        return (x if mask is None else x * mask).sum() / count

    policy_loss = -masked_mean(log_pi * adv)
    value_loss = masked_mean((returns - v) ** 2)
    total = policy_loss + value_coef * value_loss
    mean_entropy = None
    if entropy_coef != 0 or metrics:
        mean_entropy = masked_mean(-(log_probs.exp() * log_probs).sum(-1))
        if entropy_coef != 0:
            total = total - entropy_coef * mean_entropy
    if loss_scale != 1:
        total = loss_scale * total
    stats: dict[str, float] = {}
    if metrics:
        parts = torch.stack([total.detach(), policy_loss.detach(), value_loss.detach(),
                             mean_entropy.detach(), masked_mean(v.detach()),
                             masked_mean(adv.abs())]).tolist()
        stats = dict(zip(("loss", "policy_loss", "value_loss", "entropy", "value_mean",
                          "advantage_abs_mean"), parts))
    return total, stats
