"""TD3 (Fujimoto et al. 2018) on DDPG's base (`pal_hpc.algos.ddpg`): what it adds.

- Twin critics and the clipped double-Q target min(Q1', Q2') (DDPG's loss already
  takes the min over however many critics there are).
- Target policy smoothing: a' = clip(actor'(s') + clip(N(0, target_noise),
  -noise_clip, noise_clip), -1, 1), the noise drawn from this learner's own seeded
  generator (saved in the checkpoint), so a run is reproducible; with the batch split
  across learners each draws the whole batch's noise and keeps its rows (`set_rows`).
- A delayed actor: update u has the "actor" phase (actor step, then Polyak on both
  targets) only when (u + 1) % policy_delay == 0.
"""

from __future__ import annotations

import numpy as np
import torch

from pal_hpc.algos.configs import TD3Config, TD3Spec
from pal_hpc.algos.ddpg import DDPG


def smooth_target_action(mean: torch.Tensor, noise_std: float, noise_clip: float,
                         generator: torch.Generator | None = None,
                         noise: torch.Tensor | None = None) -> torch.Tensor:
    """clip(mean + clip(noise_std * z, -noise_clip, noise_clip), -1, 1), z ~ N(0, 1) of
    mean's shape: `noise` when given, else drawn from `generator`."""
    if noise is None:
        noise = torch.randn(mean.shape, generator=generator, device=mean.device,
                            dtype=mean.dtype)
    noise = (noise * noise_std).clamp_(-noise_clip, noise_clip)
    return (mean + noise).clamp_(-1.0, 1.0)


class TD3(TD3Spec, DDPG):
    """DDPG with twin critics, target policy smoothing and a delayed actor."""

    n_critics = 2

    def __init__(self, obs_space, act_space, config: TD3Config | None = None, *,
                 device="cpu", seed: int = 0):
        super().__init__(obs_space, act_space, config, device=device, seed=seed)
        # Its own stream (not the one that drew the initial weights), from `seed` alone.
        stream_seed = int(np.random.SeedSequence([seed, 3]).generate_state(1, np.uint64)[0])
        self.noise_generator = torch.Generator(device=self.device)
        self.noise_generator.manual_seed(stream_seed)

    def phases(self, update: int) -> tuple[str, ...]:
        if (update + 1) % self.config.policy_delay == 0:
            return ("critic", "actor")
        return ("critic",)

    def target_action(self, next_obs: torch.Tensor) -> torch.Tensor:
        mean = self.actor_target(next_obs)
        noise = self.row_noise(len(mean), mean.shape[1], self.noise_generator, mean.device)
        return smooth_target_action(mean, self.config.target_noise, self.config.noise_clip,
                                    noise=noise)

    def state_dict(self) -> dict:
        """DDPG's state and the smoothing-noise generator's."""
        return {**super().state_dict(), "noise_generator": self.noise_generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.noise_generator.set_state(torch.as_tensor(state["noise_generator"],
                                                       dtype=torch.uint8).cpu())
