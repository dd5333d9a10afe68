"""pal_hpc across hosts that share no memory: test hosts as namespaces on this machine
(`pal_hpc.cluster.testhosts`), each with its own network, hostname, IPC, PID and
/dev/shm, one veth link each to a bridge; hydra launches into them through
`-launcher-exec`.

Shown here: the hosts are apart (nothing but the link joins them); DQN, TD3 under
`--schedule sync` and PAAC train across 2 and 3 hosts with one replay (or master) per
host and identical learners, their gradients crossing the links, and a checkpoint taken
across hosts resumes; a host whose ranks are killed ends the job in seconds and the
newest checkpoint still verifies; a partition (one host's link cut, no RST) ends every
rank on both sides within --peer-timeout plus 30 s; a host that cannot be reached at
start-up, or a host list naming an unknown host, fails at once naming it.

Root is needed for namespaces: without it these tests skip, saying why -- except under
PAL_REQUIRE_TESTHOSTS=1 (CI), where they fail.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest

from conftest import FAST_FLAGS, ROOT, VENDOR, mpi_env
from pal_hpc.cluster.deadline import PEER_LOST_EXIT
from pal_hpc.cluster.testhosts import TestHosts, unavailable
from pal_hpc.io import checkpoint as ckpt
from pal_hpc.io.provenance import describe_cpu

pytestmark = [pytest.mark.mpi, pytest.mark.skipif(VENDOR != "mpich" and VENDOR != "openmpi",
                                                   reason=f"launcher {VENDOR}")]


@pytest.fixture(scope="module")
def hosts():
    """Three test hosts for the whole module, removed after it (also on failure)."""
    why = unavailable()
    if why:
        if os.environ.get("PAL_REQUIRE_TESTHOSTS") == "1":
            pytest.fail(f"PAL_REQUIRE_TESTHOSTS=1 but {why}")
        pytest.skip(why)
    with TestHosts(3, tag="t") as made:
        yield made


def pal(hosts, nprocs, run_dir, *flags, on=None, fast=True):
    """mpiexec across `on` (default: the first nprocs / 2 hosts), 2 ranks a host."""
    on = on or hosts.names[:nprocs // 2]
    argv = [sys.executable, "-m", "mpi4py", "-m", "pal_hpc.main",
            *(FAST_FLAGS if fast else []), "--run-dir", str(run_dir), *flags]
    return hosts.mpiexec_argv(nprocs, argv, ppn=2, hosts=on)


def run(cmd, timeout=180):
    try:
        return subprocess.run(cmd, cwd=ROOT, env=mpi_env(), capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(map(str, cmd))} hung for {timeout}s:\n{exc.stderr or ''}")


def summary_of(run_dir) -> dict:
    return json.loads((Path(run_dir) / "summary.json").read_text())


def test_test_hosts_share_nothing_but_their_links(hosts):
    a, b = hosts.names[:2]
    assert hosts.run(a, "hostname").stdout.strip() == a
    # A private /dev/shm and IPC: what one host puts there, the other does not see.
    hosts.run(a, "echo x > /dev/shm/pal-test-apart")
    assert hosts.run(a, "ls /dev/shm").stdout.split() == ["pal-test-apart"]
    assert "pal-test-apart" not in hosts.run(b, "ls /dev/shm").stdout
    assert not Path("/dev/shm/pal-test-apart").exists()
    # Its own PID namespace: its holder is PID 1 and it sees no process of the machine.
    assert hosts.run(a, "cat /proc/1/comm").stdout.strip() == "sleep"
    assert str(os.getpid()) not in hosts.run(a, "ls /proc").stdout.split()
    # One link, on the test's own subnet, and the other hosts by name.
    addrs = hosts.run(a, "ip -4 -o addr show").stdout
    assert f"{hosts.addresses[a]}/24" in addrs and addrs.count("inet ") == 2   # lo + eth0
    assert hosts.run(a, f"getent hosts {b}").stdout.split()[0] == hosts.addresses[b]
    routes = hosts.run(a, "ip -4 route").stdout
    assert "default" not in routes, routes
    # Its own TMPDIR (a node's own /tmp), where the launchers' daemons keep their state:
    # in the shared /tmp, Open MPI's daemons -- PID 7 on every host -- shared one session
    # (/tmp/prted.7: its job directories, its hwloc shared-memory file), left behind for
    # the next job; a lost host then did not end an Open MPI job, nor a partition its
    # cut-off side.
    tmp = {h: hosts.run(h, 'echo "$TMPDIR"').stdout.strip() for h in (a, b)}
    assert tmp == {h: str(hosts.tmpdir(h)) for h in (a, b)} and tmp[a] != tmp[b]
    assert os.environ.get("TMPDIR") not in tmp.values()


def test_dqn_across_two_hosts_trains_over_the_links_checkpoints_and_resumes(hosts, tmp_path):
    run_dir = tmp_path / "dqn"
    before = {h: hosts.link_bytes(h) for h in hosts.names[:2]}
    res = run(pal(hosts, 4, run_dir, "--total-steps", "3000", "--learners-per-node", "1"))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "4 ranks, 2 node(s)" in res.stdout
    s = summary_of(run_dir)
    assert s["nodes"] == 2 and s["hosts"] == hosts.names[:2]
    assert s["cpus"] == {h: describe_cpu() for h in hosts.names[:2]}   # each host's
    assert s["learners"] == 2 and s["learner_params_identical"] is True
    with h5py.File(run_dir / "metrics.h5", "r") as f:
        logged = json.loads(f.attrs["hosts"]) if isinstance(f.attrs["hosts"], str) \
            else list(f.attrs["hosts"])
    assert sorted(set(map(str, logged))) == hosts.names[:2]
    # Each host's learner summed its gradient with the other's over its link: at least
    # one float32 gradient each way per update (the Q-network's parameters).
    n_params = (4 * 32 + 32) + (32 * 32 + 32) + (32 * 2 + 2)
    for h in hosts.names[:2]:
        crossed = hosts.link_bytes(h) - before[h]
        assert crossed > 2 * s["updates"] * n_params * 4, (h, crossed, s["updates"])
    main = Path(s["checkpoint"])
    assert len(json.loads(ckpt.verify_all(main)["replay_files"])) == 2   # one per host

    res = run(pal(hosts, 4, run_dir, "--total-steps", "4500", "--learners-per-node", "1",
                  "--resume", "latest"))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    resumed = summary_of(run_dir)
    assert resumed["resumed_from"] == str(main)
    assert resumed["params_digest_at_start"] == s["params_digest"]
    assert resumed["env_steps"] >= 4500 and resumed["learner_params_identical"] is True


def test_td3_sync_and_paac_across_three_hosts(hosts, tmp_path):
    res = run(pal(hosts, 6, tmp_path / "td3", "--algo", "td3", "--env", "Pendulum-v1",
                  "--schedule", "sync", "--round-steps", "20", "--round-updates", "2",
                  "--total-steps", "1200", "--learning-starts", "200", "--envs-per-actor", "1",
                  "--learners-per-node", "1"))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    s = summary_of(tmp_path / "td3")
    assert s["nodes"] == 3 and s["hosts"] == hosts.names and s["learners"] == 3
    assert s["learner_params_identical"] is True and s["schedule"] == "sync"

    res = run(pal(hosts, 6, tmp_path / "paac", "--algo", "paac", "--num-envs", "12",
                  "--hidden", "32", "32", "--total-steps", "3000", "--eval-every", "0",
                  "--eval-episodes", "2", fast=False))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    s = summary_of(tmp_path / "paac")
    assert s["nodes"] == 3 and s["hosts"] == hosts.names
    assert sorted(s["cpus"]) == sorted(hosts.names)
    assert s["learner_params_identical"] is True


def _start_long(hosts, run_dir, *flags):
    cmd = pal(hosts, 4, run_dir, "--total-steps", "10000000", "--checkpoint-every", "2",
              "--learners-per-node", "1", *flags)
    return subprocess.Popen(cmd, cwd=ROOT, env=mpi_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_for_checkpoint(run_dir, proc, timeout=90):
    deadline = time.monotonic() + timeout
    while not ckpt.list_checkpoints(run_dir):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"no checkpoint appeared (rc {proc.returncode}):\n{err[-3000:]}")
        time.sleep(0.2)


def _gone(hosts, names, since, limit):
    """{host: seconds after `since` when its last pal_hpc rank was gone} within `limit`."""
    gone = {}
    while len(gone) < len(names) and time.monotonic() - since < limit:
        for h in names:
            if h not in gone and not hosts.processes(h, "pal_hpc.main"):
                gone[h] = time.monotonic() - since
        time.sleep(0.25)
    return gone


def test_a_lost_host_ends_the_job_in_seconds_and_the_run_resumes_without_it(hosts, tmp_path):
    run_dir = tmp_path / "lost"
    proc = _start_long(hosts, run_dir)
    try:
        _wait_for_checkpoint(run_dir, proc)
        lost = hosts.names[1]
        assert hosts.kill(lost, "pal_hpc.main"), "no rank on the host to kill"
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert took < 30, f"mpiexec returned {took:.1f} s after the host's ranks were killed"
    assert proc.returncode != 0
    assert f"RUNNING AT {lost}" in out + err or lost in err, err[-3000:]
    gone = _gone(hosts, hosts.names[:2], time.monotonic(), 10)
    assert set(gone) == set(hosts.names[:2]), "ranks outlived the job"
    newest = ckpt.latest_valid(run_dir)           # raises if none verifies
    assert not list(run_dir.rglob("*.tmp"))
    # The run goes on without the lost host: its checkpoint (2 nodes) resumes on the
    # remaining one, its two replay shards re-split into one.
    res = run(pal(hosts, 2, run_dir, "--total-steps", "2000", "--resume", "latest",
                  on=[hosts.names[0]]))
    assert res.returncode == 0, res.stderr[-3000:]
    s = summary_of(run_dir)
    assert s["resumed_from"] == str(newest) and s["nodes"] == 1
    assert s["hosts"] == [hosts.names[0]]
    assert s["params_digest_at_start"] == ckpt.verify(newest)["params_digest"]


def test_a_partition_ends_every_rank_on_both_sides_within_the_deadline(hosts, tmp_path):
    """Host 2's link cut after the first checkpoint: the ranks on both sides give up
    after --peer-timeout, each naming the other side's host on its stderr and in
    <run_dir>/peer_lost.log.  (hydra's mpiexec itself then waits for the cut-off proxy
    until TCP gives up, and may not forward the lines before: jobs/launch.sh ends it on
    seeing peer_lost.log.)"""
    timeout = 8
    run_dir = tmp_path / "cut"
    proc = _start_long(hosts, run_dir, "--peer-timeout", str(timeout))
    near, cut = hosts.names[:2]
    try:
        _wait_for_checkpoint(run_dir, proc)
        hosts.cut(cut)
        t0 = time.monotonic()
        gone = _gone(hosts, [near, cut], t0, timeout + 30)
        left = "" if len(gone) == 2 else "\n".join(
            f"{h}:\n" + hosts.run(h, "ps -eo pid,stat,wchan:24,etimes,args").stdout
            for h in (near, cut))
    finally:
        hosts.heal(cut)
        if proc.poll() is None:
            proc.kill()
        out, err = proc.communicate()
    assert set(gone) == {near, cut}, (f"ranks left {timeout + 30} s after the cut: {gone}\n"
                                      f"{left}\n{out[-2000:]}\n{err[-4000:]}")
    assert proc.returncode in (PEER_LOST_EXIT, -9), err[-3000:]
    record = (run_dir / "peer_lost.log").read_text().splitlines()
    from_near = [ln for ln in record if f"({near})" in ln]
    from_cut = [ln for ln in record if f"({cut})" in ln]
    assert from_near and all(f"no answer from host {cut}" in ln for ln in from_near), record
    assert from_cut and all(f"no answer from host {near}" in ln for ln in from_cut), record
    assert all(f"--peer-timeout {timeout}" in ln for ln in record), record
    ckpt.latest_valid(run_dir)
    assert not list(run_dir.rglob("*.tmp"))


def test_a_host_that_cannot_be_reached_or_is_unknown_fails_at_once(hosts, tmp_path):
    argv = [sys.executable, "-m", "mpi4py", "-m", "pal_hpc.main", "--run-dir",
            str(tmp_path / "r")]
    t0 = time.monotonic()
    res = run(hosts.mpiexec_argv(4, argv, ppn=2, hosts=[hosts.names[0], "nosuchhost"]),
              timeout=60)
    assert res.returncode != 0 and time.monotonic() - t0 < 30
    assert "unknown host 'nosuchhost'" in res.stdout + res.stderr
    far = hosts.names[2]
    hosts.cut(far)
    try:
        t0 = time.monotonic()
        res = run(hosts.mpiexec_argv(4, argv, ppn=2, hosts=[hosts.names[0], far]), timeout=90)
    finally:
        hosts.heal(far)
    assert res.returncode != 0 and time.monotonic() - t0 < 60
    assert f"connect to host {far}: No route to host" in res.stdout + res.stderr, \
        res.stderr[-2000:]
    assert not (tmp_path / "r" / "summary.json").exists()


def test_the_ssh_stand_in_is_a_session_that_ends_with_its_client(hosts):
    """What a launcher sees of a host through the hosts' "ssh": the command's output and
    exit status; and when the launcher SIGKILLs that ssh (Open MPI's mpiexec does, giving
    up on a job with a host it cannot reach), the launcher's pipes close at once and
    nothing the command started stays on the host.  With `exec nsenter` as the stand-in,
    Open MPI's daemon lived on in the reachable host holding mpiexec's pipes: the job
    had failed in 1 s and its caller waited minutes (the test above, under load)."""
    host = hosts.names[1]
    res = subprocess.run([str(hosts.wrapper), "-x", host, "hostname; echo err >&2; exit 3"],
                         capture_output=True, text=True, timeout=30)
    assert (res.returncode, res.stdout, res.stderr) == (3, f"{host}\n", "err\n")
    tag = f"sleep 3000{os.getpid() % 10}"       # one the host's ps cannot mistake

    def sleepers() -> dict[str, bool]:
        """The command's sleeps on the host: pid -> whether it leads its own session."""
        ps = hosts.run(host, "ps -eo pid=,sid=,comm=", timeout=10).stdout.split("\n")
        mine = set(map(str, hosts.processes(host, tag)))
        return {pid: pid == sid for pid, sid, comm in (line.split() for line in ps
                if len(line.split()) == 3) if comm == "sleep" and pid in mine}

    # One sleep in the command's own session, one that made its own (as daemons do).
    proc = subprocess.Popen([str(hosts.wrapper), host, f"setsid {tag} & {tag}; wait"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while sorted(sleepers().values()) != [False, True] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(sleepers().values()) == [False, True]
        proc.kill()
        t0 = time.monotonic()
        proc.communicate(timeout=20)                # both pipes at their end
        assert time.monotonic() - t0 < 5
        deadline = time.monotonic() + 10
        while hosts.processes(host, tag) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert hosts.processes(host, tag) == []      # the shell too
    finally:
        proc.kill()
        hosts.kill(host, tag)


def test_taking_test_hosts_down_leaves_nothing_behind():
    why = unavailable()
    if why:
        pytest.skip(why)
    with TestHosts(1, tag="z") as h:
        name, veth = h.names[0], h.veth(h.names[0])
        assert name in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                      text=True).stdout
    assert name not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                      text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert veth not in links and h.bridge not in links
    assert not h.state.exists()
