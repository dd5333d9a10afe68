"""What a rank imports, and with the garbage collector paused.

`pal_hpc.main` turns the collector off while a rank imports its stack; `imports_done`
freezes what the imports made and turns it back on.  torch and the algorithm's class
come later and only where a rank uses them (`torch_algorithm`): the learners, an
on-policy job's masters, and the actors of an algorithm with no numpy policy
(`pal_hpc.algos.spec.AlgoSpec.numpy_policy`).  Any other rank never imports torch:
2.6 CPU-s and ~160 MB of memory less a rank on a 2-core EPYC (Zen 3)."""

from __future__ import annotations

import gc


def imports_begin() -> None:
    """More of the stack to import after `imports_done`: no collection until the next
    `imports_done`."""
    gc.disable()


def imports_done() -> None:
    """The rank has imported its stack: move what the imports made into the collector's
    permanent generation, where a full collection while training no longer walks them
    (~260,000 objects with torch), and collect again from here on.  The few cycles the
    imports left unreachable (~7,000 objects, under a MB) stay with them."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def torch_algorithm(name: str) -> type:
    """The algorithm class of --algo `name` (`pal_hpc.algos.ALGOS`), importing torch
    with the collector paused (`import torch` alone runs ~380 collections, 0.14 s of a
    1.56 s import), and with float32 denormals flushed to zero on this rank."""
    imports_begin()
    import torch

    from pal_hpc.algos import ALGOS

    algo = ALGOS[name]
    imports_done()
    # Adam's second moments of small gradients decay into float32 denormals, and x86
    # arithmetic on denormals is ~50x slower: it made the optimizer step the learner's
    # biggest cost.  Flush them to zero (FTZ/DAZ; values < 1.2e-38).
    torch.set_flush_denormal(True)
    return algo


__all__ = ["imports_begin", "imports_done", "torch_algorithm"]
