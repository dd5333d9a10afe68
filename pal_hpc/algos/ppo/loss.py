"""PPO's maths on a round: generalized advantage estimation (GAE) with the cuts and
bootstraps of next-step autoreset, and the clipped surrogate loss of one minibatch.

The round's layout is PAAC's (`pal_hpc.algos.paac.loss`): t_max steps of n envs,
`valid` False on the reset step after an episode's end (no transition: left out of
the batch).  With `values` (T + 1, N) = V(s_0) .. V(s_T),

    delta_t = r_t + gamma * V'_{t+1} - V(s_t),   A_t = delta_t + gamma lambda c_t A_{t+1}

where V'_{t+1} is 0 when the episode terminated at t, V(s_{t+1}) otherwise -- also when
it was truncated at t: under next-step autoreset s_{t+1} is then the episode's last
observation (its value is what the policy computed on the reset step, or V(s_T)), so a
time limit bootstraps as the episode would have gone on; c_t is 0 at an episode's end
(either kind: the next step belongs to no episode) and 1 otherwise.  A_{T} = 0 and
V'_T = V(s_T) bootstrap the round's end.  Returns are A_t + V(s_t).  (CleanRL treats a
truncation as a termination; this is where we differ, on purpose.)

The minibatch loss (CleanRL's, per row i of a minibatch of B rows over all masters):

    r_i = exp(log pi(a_i|s_i) - log pi_old(a_i|s_i))
    pg  = sum max(-A_i r_i, -A_i clip(r_i, 1 - eps, 1 + eps)) / B
    v   = 0.5 sum max((V_i - R_i)^2, (V_old,i + clip(V_i - V_old,i, -eps, eps) - R_i)^2) / B
          (without value clipping: 0.5 sum (V_i - R_i)^2 / B)
    loss = pg - ent_coef sum H_i / B + vf_coef v

with A_i normalized by the minibatch's mean and std (ddof 1, + 1e-8) when norm_adv.
A master holds some of the minibatch's rows; dividing by the whole minibatch's B makes
the masters' summed gradients the gradient of the minibatch's loss.
"""

from __future__ import annotations

import numpy as np
import torch

# The per-row sums each step adds to its gradient's Allreduce (divided by B after).
SUMS = ("policy_loss", "value_loss", "entropy", "approx_kl", "old_approx_kl", "clipfrac")


def gae(rewards: np.ndarray, values: np.ndarray, terminated: np.ndarray,
        truncated: np.ndarray, gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """(advantages, returns), each (T, N) float64, of one round (see the module
    docstring); the rows of reset steps are meaningless and must be left out."""
    rewards = np.asarray(rewards, np.float64)
    values = np.asarray(values, np.float64)
    t_max = rewards.shape[0]
    if values.shape != (t_max + 1, *rewards.shape[1:]):
        raise ValueError(f"values: shape {values.shape}, expected "
                         f"{(t_max + 1, *rewards.shape[1:])}")
    adv = np.empty_like(rewards)
    last = np.zeros(rewards.shape[1:])
    for t in range(t_max - 1, -1, -1):
        ended = terminated[t] | truncated[t]
        nxt = np.where(terminated[t], 0.0, values[t + 1])
        delta = rewards[t] + gamma * nxt - values[t]
        last = delta + gamma * lam * np.where(ended, 0.0, last)
        adv[t] = last
    return adv, adv + values[:t_max]


def ppo_loss(logp: torch.Tensor, entropy: torch.Tensor, value: torch.Tensor,
             old_logp: torch.Tensor, adv: torch.Tensor, returns: torch.Tensor,
             old_value: torch.Tensor, size: int, *, clip_coef: float, clip_vloss: bool,
             ent_coef: float, vf_coef: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss of this master's rows of a minibatch of `size` rows (all masters), and
    the sums of `SUMS` over these rows (detached, float32).  `adv` is already
    normalized."""
    logratio = logp - old_logp
    ratio = logratio.exp()
    pg = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip_coef, 1 + clip_coef)).sum()
    unclipped = (value - returns) ** 2
    if clip_vloss:
        clipped = old_value + (value - old_value).clamp(-clip_coef, clip_coef)
        v = 0.5 * torch.max(unclipped, (clipped - returns) ** 2).sum()
    else:
        v = 0.5 * unclipped.sum()
    ent = entropy.sum()
    loss = (pg - ent_coef * ent + vf_coef * v) / size
    with torch.no_grad():
        sums = torch.stack([pg, v, ent, ((ratio - 1) - logratio).sum(), (-logratio).sum(),
                            ((ratio - 1).abs() > clip_coef).float().sum()])
    return loss, sums.float()


def explained_variance(values: np.ndarray, returns: np.ndarray) -> float:
    """1 - Var(R - V) / Var(R) over the round's rows (NaN when Var(R) is 0)."""
    var = np.var(returns)
    return float("nan") if var == 0 else float(1 - np.var(returns - values) / var)
