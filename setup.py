"""Build pal_hpc and its native core (cython/ -> pal_hpc.replay._ksumtree, _replaycore,
_framecore, pal_hpc.algos._optimcore, _convcore,
pal_hpc.cluster._seqlock,
pal_hpc.envs._lockstep).

Compiler flags are portable by default (safe on any x86-64 CI runner);
set PAL_NATIVE_ARCH=1 to add -march=native for a build that only runs here.
Set PAL_NO_OPENMP=1 to build without OpenMP.
`python -m build` makes the sdist (sources listed in MANIFEST.in) and the wheel.
"""
import os
import tempfile

import numpy as np
from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

NO_COMPILER = ("pal_hpc needs a C compiler (gcc/cc; set CC to choose one) to build its native "
               "core, and {cc!r} could not compile a one-line C file: {err}")


# Cythonize and compile the extensions on every core (`make install`, the wheel): the
# compile 37 s -> 21 s on 2 cores.
JOBS = os.cpu_count() or 1


class build_ext_checked(build_ext):
    """build_ext that first compiles a one-line C file, so a missing compiler ends the
    build with a message saying so instead of a bare "command 'gcc' failed"; it builds
    the extensions in parallel unless told otherwise (--parallel/-j)."""

    def finalize_options(self):
        super().finalize_options()
        if not self.parallel:
            self.parallel = JOBS

    def run(self):
        # Cython runs here, when the extensions are built, not whenever setup.py is
        # read: `python -m build` makes the sdist (which ships the .pyx, not the .c)
        # without it, 13 CPU-s less before the wheel is built from that sdist.
        from Cython.Build import cythonize

        built = {e.name: e for e in cythonize(
            self.extensions, compiler_directives={"language_level": "3"},
            include_path=["cython"], nthreads=JOBS if JOBS > 1 else 0)}
        for ext in self.extensions:      # setuptools' own annotations stay on them
            ext.sources = built[ext.name].sources
        super().run()

    def build_extensions(self):
        with tempfile.TemporaryDirectory() as tmp:
            probe = os.path.join(tmp, "probe.c")
            with open(probe, "w") as f:
                f.write("int pal_probe(void) { return 0; }\n")
            try:
                self.compiler.compile([probe], output_dir=tmp)
            except Exception as err:  # CompileError, or the executable missing
                cc = (getattr(self.compiler, "compiler_so", None) or ["cc"])[0]
                raise SystemExit("error: " + NO_COMPILER.format(cc=cc, err=err)) from None
        super().build_extensions()


# -g0: no debug information (Python's own CFLAGS ask for it): a fifth less compile time
# for Cython's megabyte-sized C files, and extensions a quarter of the size.
compile_args = ["-O3", "-g0", "-fno-math-errno", "-Wno-unused-function"]
link_args = []
if os.environ.get("PAL_NO_OPENMP") != "1":
    compile_args.append("-fopenmp")
    link_args.append("-fopenmp")
if os.environ.get("PAL_NATIVE_ARCH") == "1":
    compile_args.append("-march=native")

extensions = [
    Extension(
        "pal_hpc.replay._ksumtree",
        sources=["cython/ksumtree.pyx"],
        include_dirs=["cython", np.get_include()],
        depends=["cython/ksum_core.h", "cython/ksum_core.pxd"],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    ),
    Extension(
        "pal_hpc.replay._replaycore",
        sources=["cython/replaycore.pyx"],
        include_dirs=["cython", np.get_include()],
        depends=["cython/ksum_core.h", "cython/ksum_core.pxd", "cython/sync_core.h"],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    ),
    Extension(
        "pal_hpc.replay._framecore",
        sources=["cython/framecore.pyx"],
        include_dirs=["cython", np.get_include()],
        depends=["cython/ksum_core.h", "cython/ksum_core.pxd", "cython/sync_core.h",
                 "cython/frames_core.h"],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    ),
    Extension(
        "pal_hpc.cluster._seqlock",
        sources=["cython/seqlock.pyx"],
        include_dirs=["cython"],
        depends=["cython/ksum_core.h", "cython/ksum_core.pxd", "cython/sync_core.h"],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
    ),
    Extension(
        "pal_hpc.algos._optimcore",
        sources=["cython/optimcore.pyx"],
        include_dirs=["cython"],
        depends=["cython/optim_core.h"],
        # the same float32 values on every CPU (no fused multiply-adds): optim_core.h
        extra_compile_args=compile_args + ["-ffp-contract=off"],
        extra_link_args=link_args,
    ),
    Extension(
        "pal_hpc.algos._convcore",
        sources=["cython/convcore.pyx"],
        include_dirs=["cython"],
        depends=["cython/conv_core.h"],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
    ),
    Extension(
        "pal_hpc.envs._lockstep",
        sources=["cython/lockstep.pyx"],
        include_dirs=["cython"],
        depends=["cython/lockstep_core.h"],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
    ),
]

setup(
    name="pal_hpc",
    version="0.1.0",
    description="Parallel actors and learners for reinforcement learning on MPI HPC nodes",
    packages=find_packages(include=["pal_hpc", "pal_hpc.*"]),
    python_requires=">=3.10",
    install_requires=["numpy", "mpi4py", "torch", "gymnasium", "h5py"],
    # pal_hpc.integrations: pins in requirements-sb3.txt / requirements-torchrl.txt;
    # --tensorboard: requirements-tensorboard.txt; MuJoCo envs: requirements-mujoco.txt;
    # MinAtar ids: requirements-minatar.txt (`pip install --no-deps minatar==1.0.15`
    # suffices: the games need numpy alone; the extra brings its plotting stack too).
    extras_require={
        "tensorboard": ["tensorboard>=2.21,<3"],
        "sb3": ["stable-baselines3>=2.9,<3"],
        "torchrl": ["torchrl>=0.14.1,<0.15", "tensordict>=0.14.3,<0.15"],
        "multiagent": ["pettingzoo>=1.27,<2", "magent2>=0.3.4,<0.4"],
        "mujoco": ["mujoco>=3", "imageio>=2.14.1"],
        "minatar": ["minatar>=1.0.15,<2"],
    },
    ext_modules=extensions,          # cythonized by build_ext_checked
    cmdclass={"build_ext": build_ext_checked},
    zip_safe=False,
)
