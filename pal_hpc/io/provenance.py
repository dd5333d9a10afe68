"""What ran, where, with what: the root attributes of a run's metrics log."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import h5py

from pal_hpc.io.attrs import clean_text

VERSIONED_PACKAGES = ("numpy", "torch", "gymnasium", "h5py", "mpi4py")


def _git_commit() -> str:
    """HEAD of the checkout the package runs from, or "" (installed copy, no git)."""
    try:
        res = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return ""
    return res.stdout.strip() if res.returncode == 0 else ""


def _versions() -> dict[str, str]:
    """Versions of the stack, from package metadata (importing torch would take seconds)."""
    import pal_hpc

    versions = {"python": platform.python_version()}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = ""
    versions["hdf5"] = h5py.version.hdf5_version
    versions["pal_hpc"] = pal_hpc.__version__
    return versions


# /proc/cpuinfo flags, best first, and the words a description gives them: what the
# numeric kernels (AVX-512 or AVX2 versions) and torch's bf16 (native or ~7x slower)
# depend on, so a figure can be read beside the CPU it came from.
_ISA_FLAGS = (("avx512_bf16", "AVX-512 with native bf16"), ("avx512f", "AVX-512, no native bf16"),
              ("avx2", "AVX2, no AVX-512"))


def describe_cpu(cpuinfo: str | None = None, cpus: int | None = None) -> str:
    """This machine's CPU in one line: model name, family and model, its widest vector
    instructions, and how many CPUs this process may use, e.g. "AMD EPYC 7B13 (family
    25 model 1), AVX2, no AVX-512, 2 CPUs".  `cpuinfo`: /proc/cpuinfo's text (read
    here when None; where there is none, the platform's processor name)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break                   # the first processor's block is enough
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name") or platform.processor() or platform.machine() or "?"
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']} model {fields['model']})"
    flags = set(fields.get("flags", "").split())
    isa = next((words for flag, words in _ISA_FLAGS if flag in flags),
               "no AVX2" if flags else "")
    if cpus is None:
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = os.cpu_count() or 0
    count = f"{cpus} CPU" + ("" if cpus == 1 else "s")
    return ", ".join(part for part in (clean_text(name), isa, count) if part)


def cpus_line(cpus: dict) -> str:
    """The start-up line naming each CPU of the job and its hosts (`cpus`: host ->
    `describe_cpu()`)."""
    by_cpu: dict[str, list[str]] = {}
    for host, cpu in cpus.items():
        by_cpu.setdefault(cpu, []).append(host)
    parts = [f"{cpu} ({'host' if len(hosts) == 1 else f'{len(hosts)} hosts'} "
             f"{', '.join(hosts[:4])}{', ...' if len(hosts) > 4 else ''})"
             for cpu, hosts in by_cpu.items()]
    return "pal_hpc: CPU " + "; ".join(parts)


def run_attributes(cfg_dict: dict, layout: dict, hosts: list, mpi_library: str,
                   cpus: dict | None = None) -> dict:
    """The root attributes the runtime gives `MetricsLog`: what ran, where, with what.

    The text that comes from outside (the MPI library's version string, which ends in
    a NUL under Open MPI; host names; CPU names; git's output) is cleaned to what HDF5
    stores."""
    return {
        "config": cfg_dict,
        "versions": _versions(),
        "mpi_library": clean_text(mpi_library),
        "layout": layout,
        "hosts": [clean_text(str(host)) for host in hosts],
        # host -> describe_cpu() there (the first rank's on each host)
        "cpus": {clean_text(str(h)): clean_text(str(c)) for h, c in (cpus or {}).items()},
        "start_time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git_commit": clean_text(_git_commit()),
    }
