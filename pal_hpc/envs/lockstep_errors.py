"""Errors of lockstep workers, raised in the master as gymnasium's AsyncVectorEnv raises them.

A worker reports each failing environment as plain data (`error_record`: env index, the
command, the exception's type by module and name, its message and traceback).  The
master logs each one through gymnasium's logger, as AsyncVectorEnv does, and raises the
last one as an exception that is both a `LockstepError` and, where the type can be found
among the modules already imported (nothing is imported or unpickled to find it), the
env's own type: `except ValueError` and `except LockstepError` both catch it.
"""

from __future__ import annotations

import sys

from gymnasium import logger

from pal_hpc.envs.lockstep_protocol import LockstepError

_TYPES: dict[type, type] = {}


def _find_type(module: str, qualname: str) -> type | None:
    obj = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None) if obj is not None else None
    if isinstance(obj, type) and issubclass(obj, Exception):
        return obj
    return None


def exception_for(module: str, qualname: str, message: str) -> LockstepError:
    """A LockstepError that is also an instance of module.qualname where that can be."""
    cls = _find_type(module, qualname)
    if cls is None or issubclass(cls, LockstepError) or cls is RuntimeError:
        return LockstepError(message)
    sub = _TYPES.get(cls)
    if sub is None:
        try:
            sub = type(f"Lockstep{cls.__name__}", (LockstepError, cls),
                       {"__module__": __name__, "__doc__": f"A worker's {cls.__name__}."})
        except TypeError:                    # e.g. OSError: a layout that does not mix
            sub = LockstepError
        _TYPES[cls] = sub
    try:
        return sub(message)
    except Exception:
        return LockstepError(message)


def raise_failures(failures: list[tuple], ranges: list[tuple[int, int]],
                   master_envs: int = 0) -> None:
    """Log every (worker, error record) and raise the last one; worker -1 is the
    master's own share, envs [0, master_envs)."""
    for w, (i, what, _, _, _, trace) in failures:
        env = f"Worker-{i}" if i >= 0 else f"lockstep worker {w}"
        logger.error(f"Received the following error from {env} - Shutting it down")
        logger.error(f"{trace}")
    logger.error("Raising the last exception back to the main process.")
    w, (i, what, module, qualname, message, trace) = failures[-1]
    where = f"worker {w}"
    if w < 0:
        where = f"master (its own envs 0..{master_envs - 1})"
    elif w < len(ranges):
        lo, hi = ranges[w]
        where += f" (envs {lo}..{hi - 1})"
    env = f" in env {i}" if i >= 0 else ""
    text = f"{message}\n\nlockstep {where} raised {qualname} during {what}{env}:\n{trace}"
    raise exception_for(module, qualname, text)
