"""FlatAdam and FlatRMSProp: the learners' optimizers over one flat vector, against
torch.optim's, and RMSProp's one-pass CPU kernel against its tensor ops."""

import numpy as np
import pytest
import torch

from pal_hpc.algos.optim import FlatAdam, FlatRMSProp


def grads(rng, n, steps):
    # Scales spanning six decades, as a network's layers produce.
    scale = 10.0 ** rng.uniform(-6, 0, n)
    return [torch.as_tensor(rng.normal(size=n) * scale, dtype=torch.float32) for _ in range(steps)]


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("clip", [0.0, 0.5])
def test_matches_torch_adam(fused, clip):
    rng = np.random.default_rng(0)
    n = 1000
    start = torch.as_tensor(rng.normal(size=n), dtype=torch.float32)
    ours = start.clone()
    opt = FlatAdam(ours, lr=3e-3, betas=(0.8, 0.99), eps=1e-7, fused=fused)
    ref = start.clone().requires_grad_(True)
    ref_opt = torch.optim.Adam([ref], lr=3e-3, betas=(0.8, 0.99), eps=1e-7,
                               foreach=False, fused=False)
    clipped = 0
    for g in grads(rng, n, 20):
        g = g * 5  # norms around 1-10, so a clip of 0.5 bites
        opt.step(g.clone(), clip_norm=clip)
        ref.grad = g.clone()
        if clip > 0:
            clipped += torch.nn.utils.clip_grad_norm_([ref], clip).item() > clip
        ref_opt.step()
        np.testing.assert_allclose(ours.numpy(), ref.detach().numpy(), rtol=2e-5, atol=1e-7)
    assert opt.step_count == 20
    assert clipped == (20 if clip > 0 else 0)
    assert not torch.equal(ours, start)


@pytest.mark.parametrize("fused", [True, False])
def test_state_dict_round_trip_continues_identically(fused):
    rng = np.random.default_rng(1)
    a = torch.as_tensor(rng.normal(size=64), dtype=torch.float32)
    opt_a = FlatAdam(a, lr=1e-2, fused=fused)
    steps = grads(rng, 64, 6)
    for g in steps[:3]:
        opt_a.step(g.clone())
    b = a.clone()
    opt_b = FlatAdam(b, lr=1.0, betas=(0.5, 0.5), eps=1.0, fused=fused)  # all overwritten
    opt_b.load_state_dict({k: (v.clone() if torch.is_tensor(v) else v)
                           for k, v in opt_a.state_dict().items()})
    assert opt_b.step_count == 3 and opt_b.lr == 1e-2 and opt_b.betas == (0.9, 0.999)
    for g in steps[3:]:
        opt_a.step(g.clone())
        opt_b.step(g.clone())
    assert torch.equal(a, b)


def test_bad_input_is_named_and_changes_nothing():
    p = torch.zeros(8)
    with pytest.raises(ValueError, match="1-D"):
        FlatAdam(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="lr"):
        FlatAdam(p, lr=0.0)
    opt = FlatAdam(p)
    opt.step(torch.ones(8))
    before = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in opt.state_dict().items()}
    bad = dict(before, exp_avg=torch.zeros(9))
    with pytest.raises(ValueError, match="exp_avg"):
        opt.load_state_dict(bad)
    with pytest.raises(ValueError, match="step"):
        opt.load_state_dict(dict(before, step=-1))
    with pytest.raises(ValueError, match="exp_avg_sq"):   # e.g. a torch.optim state dict
        opt.load_state_dict({"state": {}, "param_groups": []})
    after = opt.state_dict()
    assert after["step"] == before["step"]
    assert torch.equal(after["exp_avg"], before["exp_avg"])


RMSPROPS = {"tf": dict(eps_in_sqrt=True, initial_square=1.0, decay=0.99, eps=0.1),
            "torch": dict(eps_in_sqrt=False, initial_square=0.0, decay=0.9, eps=1e-3),
            "centered": dict(eps_in_sqrt=False, initial_square=0.0, decay=0.95, eps=0.01,
                             centered=True),
            "centered-tf": dict(eps_in_sqrt=True, initial_square=1.0, decay=0.95, eps=0.1,
                                centered=True)}


@pytest.mark.parametrize("variant", sorted(RMSPROPS))
def test_rmsprop_one_pass_kernel_is_its_tensor_ops(variant):
    """On the CPU FlatRMSProp steps through cython/optimcore.pyx; it agrees with the
    tensor ops (the path on a GPU) to float32 rounding, clipped and annealed steps
    included, and its state (the tensors the kernel wrote through) round-trips."""
    rng = np.random.default_rng(3)
    n = 4099                          # not a multiple of any vector width
    start = torch.as_tensor(rng.normal(size=n), dtype=torch.float32)
    kernel = FlatRMSProp(start.clone(), lr=0.01, **RMSPROPS[variant])
    ops = FlatRMSProp(start.clone(), lr=0.01, **RMSPROPS[variant])
    assert kernel._fused
    ops._fused = False
    for i, g in enumerate(grads(rng, n, 30)):
        g = g * 20
        lr = 0.01 * (1 - i / 30)
        assert kernel.step(g.clone(), clip_norm=2.0, lr=lr) == ops.step(g.clone(), 2.0, lr)
        for a, b in ((kernel.param, ops.param), (kernel.square_avg, ops.square_avg),
                     (kernel.grad_avg, ops.grad_avg)):
            if a is not None:
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch.equal(kernel.param, start)
    twin = FlatRMSProp(start.clone(), lr=0.01, **RMSPROPS[variant])
    twin.load_state_dict({k: (v.clone() if torch.is_tensor(v) else v)
                          for k, v in kernel.state_dict().items()})
    twin.param.copy_(kernel.param)
    g = grads(rng, n, 1)[0]
    kernel.step(g.clone())
    twin.step(g.clone())
    assert torch.equal(kernel.param, twin.param) and twin.steps == kernel.steps


@pytest.mark.parametrize("eps_in_sqrt", [False, True])
@pytest.mark.parametrize("centered", [False, True])
def test_rmsprop_kernel_is_float32_arithmetic_to_the_bit(centered, eps_in_sqrt):
    """The one-pass kernel (whichever instruction set's version the CPU got) is numpy's
    float32 arithmetic in the same order, bit for bit: no fused multiply-adds, so hosts
    with different CPUs step the same averaged gradient to the same parameters."""
    from pal_hpc.algos._optimcore import rmsprop_step

    rng = np.random.default_rng(11)
    n = 4099
    f32 = np.float32
    lr, decay, eps = 2.5e-4, 0.95, 0.01
    param = rng.normal(size=n).astype(f32)
    sq = np.zeros(n, f32)
    ga = np.zeros(n, f32)
    want_p, want_sq, want_ga = param.copy(), sq.copy(), ga.copy()
    neg_lr, d, keep, e = f32(-lr), f32(decay), f32(1.0 - decay), f32(eps)
    for _ in range(20):
        g = rng.normal(size=n).astype(f32)
        rmsprop_step(param, g, sq, ga, lr, decay, eps, eps_in_sqrt, centered)
        want_sq = want_sq * d
        want_sq = want_sq + keep * g * g
        var = want_sq
        if centered:
            want_ga = want_ga + keep * (g - want_ga)
            var = want_sq + (-want_ga) * want_ga
        denom = np.sqrt(var + e) if eps_in_sqrt else np.sqrt(var) + e
        want_p = want_p + neg_lr * (g / denom)
    np.testing.assert_array_equal(sq, want_sq)
    np.testing.assert_array_equal(param, want_p)
    if centered:
        np.testing.assert_array_equal(ga, want_ga)
