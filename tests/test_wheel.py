"""The distribution: `python -m build` makes an sdist and a wheel (built from that sdist, so
the sdist carries the native sources); the wheel, installed into a fresh venv with the pinned
stack, trains from outside the source tree; the sdist without a C compiler fails saying so."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import FAST_FLAGS, ROOT, mpi_env

pytestmark = [pytest.mark.slow, pytest.mark.mpi]


def _run(cmd, cwd, timeout, env=None) -> subprocess.CompletedProcess:
    """Run `cmd`; fail the test with its output on a non-zero exit or a timeout."""
    try:
        proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{cmd} did not finish within {timeout}s:\n{exc.stdout}\n{exc.stderr}")
    assert proc.returncode == 0, f"{cmd}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def _outside_env() -> dict:
    """The environment for the fresh venv's commands: nothing pointing into the source
    tree, and bytecode written as the stack is first imported (it is installed with
    --no-compile: under PYTHONDONTWRITEBYTECODE every command would compile torch from
    source again, 5 s of CPU each)."""
    env = mpi_env()
    for key in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE"):
        env.pop(key, None)
    return env


def _native_modules() -> list[str]:
    """The extension modules setup.py declares (`Extension("pal_hpc....", ...)`)."""
    names = re.findall(r'Extension\(\s*"([\w.]+)"', (ROOT / "setup.py").read_text())
    assert names, "no Extension(...) found in setup.py"
    return names


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, Path]:
    """sdist and wheel from `python -m build` (isolated build env, as a user gets it)."""
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--outdir", out, ROOT], cwd=ROOT, timeout=600)
    sdists, wheels = list(out.glob("pal_hpc-*.tar.gz")), list(out.glob("pal_hpc-*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, list(out.iterdir())
    return {"sdist": sdists[0], "wheel": wheels[0]}


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory, dist) -> Path:
    """A new venv (this interpreter's version) with requirements.txt and the wheel."""
    venv = tmp_path_factory.mktemp("venv") / "v"
    _run([sys.executable, "-m", "venv", venv], cwd=venv.parent, timeout=120)
    # --no-compile: the stack's bytecode (torch's thousands of modules) is written as
    # it is first imported instead of all up front; what is installed is the same.
    _run([venv / "bin/python", "-m", "pip", "install", "--quiet", "--no-compile", "-r",
          ROOT / "requirements.txt", dist["wheel"]], cwd=venv.parent, timeout=900,
         env=_outside_env())
    return venv


def test_wheel_holds_every_module_and_extension(dist):
    names = set(zipfile.ZipFile(dist["wheel"]).namelist())
    pure = {p.relative_to(ROOT).as_posix() for p in (ROOT / "pal_hpc").rglob("*.py")}
    assert pure - names == set(), "pure modules missing from the wheel"
    for mod in _native_modules():
        stem = mod.replace(".", "/")
        assert any(n.startswith(stem + ".") and n.endswith(".so") for n in names), mod


def test_wheel_installs_and_trains_outside_the_source_tree(fresh_venv, tmp_path):
    py, env = fresh_venv / "bin/python", _outside_env()
    # Where each package and extension imports from: the fresh venv, not the checkout.
    packages = sorted({p.parent.relative_to(ROOT).as_posix().replace("/", ".")
                       for p in (ROOT / "pal_hpc").rglob("__init__.py")})
    probe = ("import importlib, json, sys, sysconfig; print(json.dumps({'site': "
             "sysconfig.get_paths()['platlib'], 'files': {m: importlib.import_module(m).__file__"
             " for m in sys.argv[1:]}}))")
    found = json.loads(_run([py, "-c", probe, *packages, *_native_modules()], cwd=tmp_path,
                            timeout=120, env=env).stdout)
    site = Path(found["site"]).resolve()
    for mod, file in found["files"].items():
        assert Path(file).resolve().is_relative_to(site), (mod, file, site)

    helped = _run([py, "-m", "pal_hpc.main", "--help"], cwd=tmp_path, timeout=120, env=env)
    assert "--total-steps" in helped.stdout

    run_dir = tmp_path / "run"
    _run([fresh_venv / "bin/mpiexec", "-n", "1", py, "-m", "mpi4py", "-m", "pal_hpc.main",
          *FAST_FLAGS, "--env", "CartPole-v1", "--total-steps", "2000", "--run-dir", run_dir],
         cwd=tmp_path, timeout=300, env=env)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["ranks"] == 1 and summary["env_steps"] >= 2000 and summary["updates"] > 0


def test_sdist_without_a_compiler_says_so(fresh_venv, dist, tmp_path):
    # The fresh venv holds the build requirements (cython, numpy, setuptools): no isolation
    # needed; CC naming a missing program stands in for a machine without gcc.
    env = dict(_outside_env(), CC=str(tmp_path / "no-such-cc"))
    proc = subprocess.run([fresh_venv / "bin/python", "-m", "pip", "install", "--no-deps",
                           "--no-build-isolation", "--target", tmp_path / "t", dist["sdist"]],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "pal_hpc needs a C compiler" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert not (tmp_path / "t" / "pal_hpc").exists()
