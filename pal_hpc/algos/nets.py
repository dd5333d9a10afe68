"""Building blocks the algorithms share: MLPs called functionally, the torso for an
observation space (a CNN on frames, an MLP on vectors), and flat parameter buffers
(every parameter and gradient a view of one vector per update phase)."""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterable, Sequence

import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import nn

from pal_hpc.algos.cnn import CNNTorso
from pal_hpc.algos.spec import ACTIVATION_NAMES, is_image

def autocast(device: torch.device, precision: str):
    """The context a learner's losses run in: bf16 autocast, or nothing for fp32.
    Backward passes follow the dtypes recorded in the forward, so a loss computed
    inside it backpropagates in bf16 into the fp32 parameters' gradients."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


class Bf16Acting:
    """A copy of an actor-critic network for acting at --precision bf16: its torsos
    (`trunk`, `value_trunk`) cast to bf16 once per change of the parameters, its heads
    fp32 as `output_linear` keeps them.

    torch.autocast casts every weight on every call and routes each op through its cast
    policy; a rollout acts T times between two updates (PPO: 128).  PPO's Nature CNN
    acting for one master's 4 Pong envs took 1.18 ms a call under autocast and 0.93 ms
    through this copy (1.79 and 1.38 ms for 8 envs; Zen 4, one thread).  Its outputs are
    autocast's bit for bit: the same bf16 weights, inputs and ops (tests/test_ppo.py).
    The owner calls `written()` after every write to the parameters (its optimizer step,
    set_flat_params, load_state_dict): torch's version counters do not see a fused
    optimizer's step, so they cannot stand in for it."""

    def __init__(self, net: nn.Module):
        # The heads are the source's own parameters (read only here): a copy would sit
        # elsewhere in memory, and an fp32 product's last bit can depend on where.
        self.net = copy.copy(net)
        self.net._modules = dict(net._modules)
        self._pairs = []
        for name in ("trunk", "value_trunk"):
            torso = getattr(net, name, None)
            if torso is not None:
                mine = _Bf16Torso(copy.deepcopy(torso).requires_grad_(False))
                setattr(self.net, name, mine)
                self._pairs += zip(mine.parameters(), torso.parameters())
        self._fresh = True

    def written(self) -> None:
        """The source's parameters changed: cast them again before the next act."""
        self._fresh = False

    def __call__(self) -> nn.Module:
        """The copy, with the source network's current parameters (call it under
        `torch.inference_mode()`, without autocast)."""
        if not self._fresh:
            with torch.no_grad():
                for mine, theirs in self._pairs:
                    mine.copy_(theirs)
            self._fresh = True
        return self.net


class _Bf16Torso(nn.Module):
    """A torso in bf16 whose input is cast as autocast casts it (frames scaled first)."""

    def __init__(self, torso: nn.Module):
        super().__init__()
        self.torso = torso.to(torch.bfloat16)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if isinstance(self.torso, CNNTorso):
            return self.torso.body(CNNTorso.scaled(obs).to(torch.bfloat16))
        return self.torso(obs.to(torch.bfloat16))


def cpu_has_bf16() -> bool:
    """Whether this CPU does bfloat16 arithmetic natively (x86's AVX512-BF16, which
    every AMX CPU also has).  Without it oneDNN emulates bf16 in fp32 with conversions
    around every product: TD3's [400, 300] update at batch 256 took 7.0x longer in bf16
    than in fp32 on an AVX2-only EPYC (`bench/profile_learner.py --algo td3
    --precision both`), where an AVX512-BF16 EPYC made the PAAC CNN faster in bf16."""
    check = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    return bool(check()) if check is not None else True   # unknown: do not warn


def bf16_cpu_note(precision: str, device: str) -> str | None:
    """The start-up warning for `--precision bf16` with learners on a CPU that lacks
    native bf16 (`cpu_has_bf16`); None when it does not apply."""
    if precision != "bf16" or device == "cuda" or (device == "auto"
                                                    and torch.cuda.is_available()):
        return None
    if cpu_has_bf16():
        return None
    return ("pal_hpc: warning: --precision bf16 on a CPU without native bfloat16 "
            "(no AVX512-BF16): torch emulates it, several times slower than fp32 "
            "(7x for TD3's update on an AVX2 EPYC); use --precision fp32 here")


def output_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
                  ) -> torch.Tensor:
    """A network's last layer, in fp32 even under bf16 autocast (its input is cast up).

    bf16 keeps 8 significant bits: a Q-value near -1.3 (DQN on Pong after 1M steps)
    comes out in steps of 0.0078, near -500 (TD3 on Pendulum) in steps of 2 -- as large
    as the action gaps and TD errors the learner works on.  Measured on the 1M-step Pong
    checkpoint (bench/q_precision.py): bf16 outputs picked another greedy action than
    fp32 on 9.1% of the states; with the last layer in fp32, 0.3%.  The layer is a
    small share of the work."""
    if x.dtype == torch.float32 and not torch.is_autocast_enabled(x.device.type):
        return F.linear(x, weight, bias)
    with torch.autocast(x.device.type, enabled=False):
        return F.linear(x.float(), weight, bias)


class MLP(nn.Module):
    """Linear layers with ReLU between them (none after the last).

    forward() calls the layers functionally: nn.Module's call machinery costs about a
    tenth of a small network's forward pass."""

    def __init__(self, sizes: Sequence[int]):
        super().__init__()
        if len(sizes) < 2:
            raise ValueError(f"an MLP needs at least input and output sizes, got {sizes}")
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The output is float32 whatever the precision: the last layer runs in fp32
        (`output_linear`)."""
        *hidden, last = self.layers
        for layer in hidden:
            x = torch.relu(F.linear(x, layer.weight, layer.bias))
        return output_linear(x, last.weight, last.bias)


ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh}
assert tuple(ACTIVATIONS) == ACTIVATION_NAMES      # the names configs accept (spec.py)


class MLPTorso(nn.Sequential):
    """Linear layers each followed by `activation` (ReLU by default, or tanh), on
    observations flattened to (N, obs_dim)."""

    def __init__(self, in_dim: int, hidden: Sequence[int], activation: str = "relu"):
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation: must be one of {', '.join(ACTIVATIONS)}, "
                             f"got {activation!r}")
        layers: list[nn.Module] = []
        width = in_dim
        for h in hidden:
            layers += [nn.Linear(width, h), ACTIVATIONS[activation]()]
            width = h
        super().__init__(*layers)
        self.out_features = width

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return super().forward(obs.reshape(obs.shape[0], -1))


def torso(obs_space: gym.Space, kind: str = "nature",
          hidden: Sequence[int] = (256, 256), activation: str = "relu") -> nn.Module:
    """The feature extractor for `obs_space`: a `CNNTorso` of `kind` ("nature" or
    "nips"; it takes uint8 frames and scales them) on image observations (`is_image`),
    else an `MLPTorso` of `hidden` widths and `activation` on the flattened float
    observation.  Either has `out_features`, the width of its output."""
    if is_image(obs_space):
        return CNNTorso(obs_space.shape, kind)
    return MLPTorso(obs_dim(obs_space), hidden, activation)


def seeded(seed: int, build):
    """`build()` under a forked torch RNG seeded with `seed`: reproducible parameters
    without touching the caller's global RNG state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


class FlatParams:
    """The parameters of some modules as views of one flat vector, and their gradients
    as views of another.

    The gradient then leaves for the Allreduce without a gather, comes back with one
    copy, is clipped with one norm and stepped by one fused Adam (`FlatAdam`) over the
    whole vector.  Never set the parameters' `.grad` to None (zero `grad` instead)."""

    def __init__(self, modules: Iterable[nn.Module], device: torch.device):
        self.params = [p for m in modules for p in m.parameters()]
        n = sum(p.numel() for p in self.params)
        self.flat = torch.empty(n, device=device)
        self.grad = torch.zeros(n, device=device)
        offset = 0
        for p in self.params:
            k = p.numel()
            self.flat[offset:offset + k].copy_(p.data.reshape(-1))
            p.data = self.flat[offset:offset + k].view_as(p)
            p.grad = self.grad[offset:offset + k].view_as(p)
            offset += k

    @property
    def numel(self) -> int:
        return self.flat.numel()


@torch.no_grad()
def polyak(target: nn.Module, online: nn.Module, tau: float) -> None:
    """target <- (1 - tau) * target + tau * online, parameter by parameter."""
    t_params = list(target.parameters())
    o_params = list(online.parameters())
    torch._foreach_lerp_(t_params, o_params, tau)


def obs_dim(obs_space) -> int:
    """Length of a flattened observation."""
    return math.prod(obs_space.shape)
