"""A throw-away SLURM cluster on this machine, for the tests of jobs/*.sbatch.

Debian's SLURM 22.05 (`slurmctld slurmd slurm-client munge`), installed with apt-get
when missing and this process is root.  Everything else lives in one temporary
directory: a munge key and a private `munged` (run as the munge user), a `slurm.conf`
and the state, spool and log files.  `slurmctld` and two `slurmd` (nodes n1 and n2 on
this host: Debian builds SLURM with MULTIPLE_SLURMD) run in the background, each under
`timeout` so that none outlives a test run that was killed; `stop` cancels every job
first (a stopped slurmd leaves its jobs running) and then ends the daemons by PID.

On test hosts (`SlurmCluster(hosts=TestHosts(...))`, pal_hpc.cluster.testhosts) each
node is a host of its own: one slurmd inside each host's namespaces (its network,
hostname, IPC, PID and /dev/shm), NodeAddr its address on the test bridge, and
slurmctld and munged here, slurmctld listening on the bridge's address; the jobs'
steps then run inside the hosts and their ranks talk TCP across the links.  munge's
socket is a file, which every host sees (the file system is shared, as on a cluster).

The settings that make it work on a 2-core machine without systemd:
`SlurmdParameters=config_overrides` lets each node advertise `cpus` CPUs;
`AuthInfo=cred_expire=10` and `SchedulerParameters=sched_interval=5` restart a requeued
job in ~20 s instead of ~150 s; `KillWait=5`.  Each node also advertises two count-only
GPUs (no device files), so `--gpus-per-node=2` is accepted; there is no CUDA behind them.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
COMMANDS = ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "srun", "sinfo",
            "munged", "mungekey")
NODES = ("n1", "n2")
DAEMON_LIFETIME_S = 1800         # the longest any daemon may run, even if nobody stops it
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


class SlurmUnavailable(RuntimeError):
    """SLURM is not installed here and cannot be (the message says why)."""


def _which(name: str) -> str | None:
    # The daemons live in /usr/sbin, which a non-root PATH may lack.
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def missing_commands() -> list[str]:
    """The SLURM and munge commands not found on this machine."""
    return [name for name in COMMANDS if _which(name) is None]


def ensure_installed(timeout: float = 600) -> None:
    """Install the SLURM packages with apt-get if any command is missing.

    Raises `SlurmUnavailable` when the cluster cannot run here: not root (the daemons
    run as root and munge), or the packages are missing and apt-get cannot install them
    (no apt-get, no package registry)."""
    missing = missing_commands()
    why = f"SLURM is not installed ({', '.join(missing)} not found)" if missing else ""
    if os.geteuid() != 0:
        raise SlurmUnavailable(f"{why + '; ' if why else ''}the throw-away SLURM needs root "
                               "(to install it and to run slurmd and munged)")
    if not missing:
        return
    if shutil.which("apt-get") is None:
        raise SlurmUnavailable(f"{why} and there is no apt-get to install it")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-qq"],
                ["apt-get", "install", "-y", "-qq", *PACKAGES]):
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise SlurmUnavailable(f"{why}; `{' '.join(cmd)}` took over {timeout:.0f}s") from None
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise SlurmUnavailable(f"{why}; `{' '.join(cmd)}` failed "
                                   f"(status {proc.returncode}): {' | '.join(tail)}")
    still = missing_commands()
    if still:
        raise SlurmUnavailable(f"{why}; after apt-get, still missing: {', '.join(still)}")


def _free_ports(n: int) -> list[int]:
    """`n` TCP ports free on 127.0.0.1 right now."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class SlurmCluster:
    """slurmctld + one slurmd per node of `NODES`, all on this host (see the module
    docstring).  `start()`, submit and inspect jobs, `stop()`."""

    def __init__(self, cpus_per_node: int = 8, gpus_per_node: int = 2, hosts=None):
        self.hosts = hosts              # a TestHosts that is up: a node on each host
        self.nodes = tuple(hosts.names) if hosts is not None else NODES
        self.cpus = cpus_per_node
        self.gpus = gpus_per_node
        self.dir = Path(tempfile.mkdtemp(prefix="pal-slurm-"))
        self.dir.chmod(0o755)           # munged insists that all may reach its socket
        self.conf = self.dir / "slurm.conf"
        self.procs: dict[str, subprocess.Popen] = {}
        self.host = socket.gethostname().split(".")[0]

    def __enter__(self) -> "SlurmCluster":
        """`with SlurmCluster(...) as c:` started, then stopped and removed on exit (also
        on failure)."""
        try:
            self.start()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
        self.remove()

    # -- set-up ---------------------------------------------------------------
    def start(self, timeout: float = 90) -> None:
        """Write the configuration, start the daemons, wait until every node is idle.
        On failure everything started is stopped and RuntimeError says what happened."""
        try:
            self._start_munge()
            self._write_conf()
            self._spawn("slurmctld", _which("slurmctld"), "-D", "-i", "-f", str(self.conf))
            for node in self.nodes:
                cmd = [_which("slurmd"), "-D", "-N", node, "-f", str(self.conf)]
                if self.hosts is not None:
                    self._cgroup_mount(node)
                    cmd = self.hosts.exec_argv(node, cmd)
                self._spawn(f"slurmd-{node}", *cmd)
            self._wait_idle(timeout)
        except BaseException:
            self.stop()
            raise

    def _cgroup_mount(self, node: str) -> None:
        """slurmd refuses to start without the machine's cgroup file systems, which a
        test host does not see (`ip netns exec` mounts the host's own /sys): mount them
        again inside the host's own mount namespace (gone with the host), the same
        hierarchies as this machine's, as a node has them."""
        cmds = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            point = fields[4]
            fstype, source, options = fields[fields.index("-") + 1:][:3]
            if point == "/sys/fs/cgroup" or point.startswith("/sys/fs/cgroup/"):
                if fstype not in ("tmpfs", "cgroup", "cgroup2"):
                    continue
                opts = ",".join(o for o in options.split(",") if o != "rw") or "defaults"
                cmds.append(f"mkdir -p {point} && mount -t {fstype} -o {opts} {source} {point}")
        if not cmds:
            return
        res = self.hosts.run(node, "mountpoint -q /sys/fs/cgroup || { " + " && ".join(cmds)
                             + "; }")
        if res.returncode != 0:
            raise RuntimeError(f"{node}: the cgroup file systems slurmd needs could not "
                               f"be mounted: {res.stderr.strip()}")

    def _start_munge(self) -> None:
        keydir, rundir = self.dir / "munge", self.dir / "munge-run"
        for d, mode in ((keydir, 0o700), (rundir, 0o755)):
            d.mkdir()
            shutil.chown(d, "munge", "munge")
            d.chmod(mode)
        key = keydir / "munge.key"
        subprocess.run([_which("mungekey"), "--create", f"--keyfile={key}"], check=True,
                       capture_output=True, timeout=30)
        shutil.chown(key, "munge", "munge")
        key.chmod(0o600)
        self.munge_socket = rundir / "munge.socket"
        # setpriv execs munged (no parent left to reap it); `timeout` bounds its life.
        self._spawn("munged", "setpriv", "--reuid=munge", "--regid=munge", "--init-groups",
                    _which("munged"), "-F", f"--socket={self.munge_socket}",
                    f"--key-file={key}", f"--pid-file={keydir / 'munged.pid'}",
                    f"--log-file={keydir / 'munged.log'}", f"--seed-file={keydir / 'seed'}")
        deadline = time.monotonic() + 30
        while not self.munge_socket.exists():
            self._check_alive("munged")
            if time.monotonic() > deadline:
                raise RuntimeError(f"munged made no socket in 30s: {self.log('munged')}")
            time.sleep(0.1)

    def _write_conf(self) -> None:
        ctld_port, *node_ports = _free_ports(1 + len(self.nodes))
        d = self.dir
        hosts = self.hosts
        ctld_addr = hosts.gateway if hosts is not None else "127.0.0.1"
        nodes = "\n".join(
            f"NodeName={n} NodeHostname={n if hosts is not None else self.host} "
            f"NodeAddr={hosts.addresses[n] if hosts is not None else '127.0.0.1'} Port={p} "
            f"CPUs={self.cpus} Gres=gpu:{self.gpus} State=UNKNOWN"
            for n, p in zip(self.nodes, node_ports))
        self.conf.write_text(f"""\
ClusterName=paltest
SlurmctldHost={self.host}({ctld_addr})
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket},cred_expire=10
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool-%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
SchedulerParameters=sched_interval=5
KillWait=5
MinJobAge=600
ReturnToService=2
MpiDefault=none
GresTypes=gpu
{nodes}
PartitionName=debug Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP
""")
        # Count-only GPUs: no device files behind them.
        # SLURM drops GPUs without device files: stand-ins (plain files) take their place.
        (d / "dev").mkdir()
        for i in range(self.gpus):
            (d / "dev" / f"fake-gpu{i}").touch()
        (d / "gres.conf").write_text(f"AutoDetect=off\nName=gpu File={d}/dev/fake-gpu[0-"
                                     f"{self.gpus - 1}]\n")
        for node in self.nodes:
            (d / f"spool-{node}").mkdir()

    def _spawn(self, name: str, *cmd: str) -> None:
        out = open(self.dir / f"{name}.out", "wb")
        self.procs[name] = subprocess.Popen(
            ["timeout", "-k", "10", str(DAEMON_LIFETIME_S), *cmd], stdout=out,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env(),
            start_new_session=True)     # apart from the test's process group
        out.close()

    def _check_alive(self, name: str) -> None:
        if self.procs[name].poll() is not None:
            raise RuntimeError(f"{name} exited with status {self.procs[name].returncode}: "
                               f"{self.log(name)}")

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        states: list[str] = []
        while time.monotonic() < deadline:
            for name in self.procs:
                self._check_alive(name)
            proc = self.cmd("sinfo", "-h", "-N", "-o", "%N %T", check=False)
            states = proc.stdout.split()
            if proc.returncode == 0 and states[1::2] == ["idle"] * len(self.nodes):
                return
            time.sleep(0.5)
        raise RuntimeError(f"the nodes were not idle within {timeout:.0f}s (sinfo: {states}); "
                           f"slurmctld log: {self.log('slurmctld')}")

    # -- use --------------------------------------------------------------------
    def env(self, **extra: str) -> dict:
        """The environment for SLURM commands (and the jobs they submit) on this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf), **extra}

    def cmd(self, *args: str, timeout: float = 30, check: bool = True,
            env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
        """Run a SLURM client command against this cluster, with a timeout."""
        proc = subprocess.run([_which(args[0]) or args[0], *args[1:]], capture_output=True,
                              text=True, timeout=timeout, env=env or self.env(), cwd=cwd)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): "
                               f"{proc.stdout}{proc.stderr}")
        return proc

    def sbatch(self, *args: str, cwd, env: dict | None = None) -> int:
        """`sbatch --parsable ARGS` from `cwd`; returns the job id."""
        proc = self.cmd("sbatch", "--parsable", *args, cwd=cwd, env=env)
        return int(proc.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict:
        """`scontrol show job` as a dict (JobState, Restarts, ExitCode, ...)."""
        out = self.cmd("scontrol", "-o", "show", "job", str(job_id)).stdout
        return dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", out))

    def wait(self, job_id: int, until, timeout: float, poll: float = 1.0) -> dict:
        """Poll the job until `until(job_dict)` holds; returns that dict.  TimeoutError
        (with the job's last state) after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            if until(info):
                return info
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} after {timeout:.0f}s: "
                                   f"JobState={info.get('JobState')} "
                                   f"Restarts={info.get('Restarts')} "
                                   f"Reason={info.get('Reason')}")
            time.sleep(poll)

    def wait_final(self, job_id: int, timeout: float) -> dict:
        """Wait until the job has ended for good (COMPLETED, FAILED, CANCELLED, ...)."""
        return self.wait(job_id, lambda j: j.get("JobState") in FINAL_STATES, timeout)

    def log(self, name: str, lines: int = 15) -> str:
        """The last lines of a daemon's log (its own log file, else its output)."""
        for path in (self.dir / f"{name}.log", self.dir / f"{name}.out",
                     self.dir / "munge" / f"{name}.log"):
            if path.exists():
                return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"

    # -- tear-down ----------------------------------------------------------------
    def cancel_all(self, timeout: float = 60) -> None:
        """Cancel every job and wait until none is left running or completing."""
        if "slurmctld" not in self.procs or self.procs["slurmctld"].poll() is not None:
            return
        self.cmd("scancel", "--user", "root", check=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            left = self.cmd("squeue", "-h", "-t", "all", "-o", "%i %T", check=False).stdout
            if not re.search(r"RUNNING|PENDING|COMPLETING|CONFIGURING|SUSPENDED|REQUEUE",
                             left):
                return
            time.sleep(0.5)

    def stop(self) -> None:
        """Cancel all jobs, then end the daemons by PID (slurmd, slurmctld, munged)."""
        try:
            self.cancel_all()
        except (subprocess.SubprocessError, OSError):
            pass
        order = [n for n in self.procs if n.startswith("slurmd")] + \
            [n for n in ("slurmctld", "munged") if n in self.procs]
        for name in order:
            proc = self.procs[name]
            if proc.poll() is None and self.hosts is not None and name.startswith("slurmd"):
                # nsenter does not pass signals on: end the slurmd inside its host.
                self.hosts.kill(name[len("slurmd-"):], "slurmd -D", signal.SIGTERM)
            elif proc.poll() is None:
                proc.send_signal(signal.SIGTERM)    # `timeout` passes it on to the daemon
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        self.procs.clear()

    def remove(self) -> None:
        """Delete the cluster's directory (after `stop`)."""
        shutil.rmtree(self.dir, ignore_errors=True)
