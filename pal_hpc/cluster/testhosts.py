"""Test hosts on one machine: N Linux namespaces that MPI takes for N hosts (root only).

Each test host is a set of namespaces held open by one sleeping process (its PID 1):

- its own network (`ip netns`), with one veth link to a bridge in the machine's own
  namespace, where mpiexec runs; the bridge is the only network the hosts share, and
  it carries no route anywhere else (no forwarding, no NAT);
- its own hostname (UTS), which MPI reports as the processor name;
- its own IPC, mount (a private tmpfs on /dev/shm, an /etc/hosts naming the test hosts)
  and PID namespaces, so that nothing -- no shared-memory segment, no process_vm_readv
  across processes -- moves data between two hosts but the network.  (With the network
  apart alone, UCX found the other host's ranks through the shared /dev/shm and kept
  training over shared memory with the link cut.)

The file system is shared, as on a cluster: run directories are seen by every host.

hydra (MPICH's mpiexec) reaches the hosts through `-launcher ssh -launcher-exec W`,
where W is a small script written by `up()` that runs the proxy's command inside the
named host (`nsenter` into its namespaces, through `testhosts_session.py`, which relays
its output and ends it when W is killed, as ssh and sshd would); Open MPI through
`--mca plm_rsh_agent W`.
`mpiexec_argv()` builds either.  Typical use (tests, or by hand on a workstation):

    with TestHosts(2) as hosts:
        subprocess.run(hosts.mpiexec_argv(4, [python, "-m", "mpi4py", "-m", "pal_hpc.main"]))
        hosts.link_bytes(hosts.names[1])     # what crossed host 1's link
        hosts.cut(hosts.names[1])            # a partition: frames dropped, no RST

    python -m pal_hpc.cluster.testhosts up 2      # by hand; `down` removes them
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

STATE_ROOT = Path("/run/pal_hpc-testhosts")
HOST_IFACE = "eth0"        # each host's end of its link, as on a real node
SESSION = Path(__file__).with_name("testhosts_session.py")   # the far end of "ssh"


class TestHostsError(RuntimeError):
    """Test hosts cannot be made here (not root, no `ip`/`nsenter`, names in use)."""


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(list(argv), capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if check and res.returncode != 0:
        raise TestHostsError(f"`{shlex.join(argv)}` failed ({res.returncode}): "
                             f"{(res.stderr or res.stdout).strip()}")
    return res


def unavailable() -> str | None:
    """Why test hosts cannot be made on this machine, or None when they can."""
    if os.geteuid() != 0:
        return "test hosts need root (network namespaces, veth links, a bridge)"
    for tool in ("ip", "nsenter", "unshare"):
        if not any(Path(d, tool).exists() for d in os.environ.get("PATH", "").split(":")
                   + ["/usr/sbin", "/sbin", "/usr/bin"]):
            return f"`{tool}` is not installed (Debian: iproute2, util-linux)"
    return None


class TestHosts:
    """`n` test hosts named `pal<tag>h1..n` on the subnet 10.<net>.<tag byte>.0/24.

    `tag` keeps concurrent sets apart (short: interface names have 15 characters);
    `up()` first removes what a crashed earlier set of the same tag left behind."""

    __test__ = False                      # not a pytest test class

    def __init__(self, n: int, tag: str = "t", net: int = 231):
        if not 1 <= n <= 200:
            raise ValueError(f"n: {n} test hosts; expected 1 to 200")
        if not (tag.isalnum() and tag.islower() and len(tag) <= 4):
            raise ValueError(f"tag: {tag!r}; expected 1 to 4 lowercase letters or digits")
        self.n, self.tag = n, tag
        self.prefix = f"pal{tag}"
        self.bridge = f"{self.prefix}br"
        self.names = [f"{self.prefix}h{i + 1}" for i in range(n)]
        third = sum(map(ord, tag)) % 250 + 1
        self.subnet = f"10.{net}.{third}"
        self.gateway = f"{self.subnet}.1"         # the bridge: where mpiexec listens
        self.addresses = {h: f"{self.subnet}.{11 + i}" for i, h in enumerate(self.names)}
        self.state = STATE_ROOT / tag
        self.wrapper = self.state / "ssh"
        self._holders: dict[str, subprocess.Popen] = {}
        self.pids: dict[str, int] = {}            # host -> its PID 1, seen from here

    # -- making and removing ---------------------------------------------------------
    def __enter__(self) -> "TestHosts":
        self.up()
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def tmpdir(self, host: str) -> Path:
        """The host's own TMPDIR (every process started on it gets it), as a node has
        its own /tmp; /tmp itself stays the machine's, as a shared file system would
        (run directories live there).  In the shared /tmp, Open MPI's daemons -- PID 7
        in every host's PID namespace -- kept one session between them ($TMPDIR/prted.7:
        job directories, the hwloc shared-memory file) and left it behind; with that, a
        lost host once did not end an Open MPI job, nor a partition its cut-off side."""
        return self.state / f"tmp-{host}"

    def veth(self, host: str) -> str:
        """The machine-side end of `host`'s link (its counters: `link_bytes`)."""
        return f"{self.prefix}v{self.names.index(host) + 1}"

    def up(self) -> "TestHosts":
        """Make the bridge and the hosts; on any failure, remove what was made."""
        why = unavailable()
        if why:
            raise TestHostsError(why)
        sweep(self.tag)
        try:
            self._make()
        except BaseException:
            self.down()
            raise
        return self

    def _make(self) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        hosts_file = self.state / "hosts"
        hosts_file.write_text("127.0.0.1 localhost\n" + f"{self.gateway} {self.prefix}gw\n"
                              + "".join(f"{a} {h}\n" for h, a in self.addresses.items()))
        for host in self.names:
            ns, veth = host, self.veth(host)
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", HOST_IFACE,
                 "netns", ns)
            _run("ip", "link", "set", veth, "master", self.bridge, "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.addresses[host]}/24", "dev", HOST_IFACE)
            _run("ip", "-n", ns, "link", "set", HOST_IFACE, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            self.tmpdir(host).mkdir(exist_ok=True)
            self.tmpdir(host).chmod(0o1777)
            self._start_holder(host, hosts_file)
        self._write_wrapper()
        (self.state / "hosts.json").write_text(json.dumps(
            {"names": self.names, "addresses": self.addresses, "pids": self.pids,
             "bridge": self.bridge, "wrapper": str(self.wrapper)}))

    def _start_holder(self, host: str, hosts_file: Path) -> None:
        setup = (f"hostname {host} && mount -t tmpfs -o mode=1777 tmpfs /dev/shm && "
                 f"mount --bind {shlex.quote(str(hosts_file))} /etc/hosts && exec sleep infinity")
        proc = subprocess.Popen(
            ["ip", "netns", "exec", host, "unshare", "--uts", "--ipc", "--mount", "--pid",
             "--fork", "--mount-proc", "--propagation", "private", "sh", "-c", setup],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True)
        self._holders[host] = proc
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise TestHostsError(f"host {host} did not start: "
                                     f"{proc.stderr.read().decode().strip()}")
            kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
            pid = int(kids.read_text().split()[0]) if kids.exists() and kids.read_text() else 0
            if pid and Path(f"/proc/{pid}/comm").read_text().strip() == "sleep":
                self.pids[host] = pid
                return
            time.sleep(0.01)
        raise TestHostsError(f"host {host} did not start within 10 s")

    def _write_wrapper(self) -> None:
        cases = "".join(f"  {h}) pid={p}; tmp={self.tmpdir(h)} ;;\n"
                        for h, p in self.pids.items())
        known = " ".join(self.names)
        self.wrapper.write_text(f"""#!/bin/sh
# hydra's / Open MPI's "ssh" for the test hosts {known}
# (pal_hpc.cluster.testhosts): run the command inside the named host's namespaces.
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-p|-l|-i|-F|-E) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
host=$1; shift
# A refusal stays up a second after it is printed: hydra reads the launcher's output and
# its end in one poll loop, and under load it saw the end first and dropped the line
# that names the host.
refuse() {{ echo "testhosts: $1" >&2; sleep 1; exit 255; }}
case "$host" in
{cases}  *) refuse "unknown host '$host' (known: {known})" ;;
esac
# ssh needs the network to reach the host: a host cut off (TestHosts.cut) is refused
# as ssh would refuse it.
if [ -e "{self.state}/cut-$host" ]; then
  refuse "connect to host $host: No route to host (its link is cut)"
fi
# Inside the host, as ssh would run it: between the command and this script's caller,
# and ended with everything it started when this "ssh" is killed (testhosts_session.py).
exec {shlex.quote(sys.executable)} -I {shlex.quote(str(SESSION))} "$pid" "$tmp" "$*"
""")
        self.wrapper.chmod(0o755)

    def down(self) -> None:
        """Kill every process on the hosts, remove the links, namespaces and bridge."""
        for host in self.names:
            pid = self.pids.pop(host, None)
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)      # PID 1 of the host: all of it goes
                except ProcessLookupError:
                    pass
            proc = self._holders.pop(host, None)
            if proc is not None:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
        sweep(self.tag)

    # -- using them ------------------------------------------------------------------
    def exec_argv(self, host: str, argv: list[str]) -> list[str]:
        """`argv` run inside `host`."""
        return ["nsenter", "-t", str(self.pids[host]), "-n", "-u", "-i", "-m", "-p", "--",
                "env", f"TMPDIR={self.tmpdir(host)}", *argv]

    def run(self, host: str, cmd: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """Run shell `cmd` on `host`; returns the finished process (text output)."""
        return subprocess.run(self.exec_argv(host, ["sh", "-c", cmd]), capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def mpiexec_argv(self, nprocs: int, command: list[str], ppn: int | None = None,
                     hosts: list[str] | None = None, vendor: str | None = None,
                     mpiexec: str | None = None) -> list[str]:
        """mpiexec placing `nprocs` ranks `ppn` a host (default: as even as they go) on
        `hosts` (default: all), through this set's wrapper."""
        from pal_hpc.cluster.launch import MPIEXEC, launcher_flags, launcher_vendor

        hosts = list(hosts or self.names)
        ppn = ppn or -(-nprocs // len(hosts))
        exe = str(mpiexec or MPIEXEC)
        vendor = vendor or launcher_vendor(exe)
        if vendor == "openmpi":
            return [exe, *launcher_flags(vendor), "--mca", "plm_rsh_agent", str(self.wrapper),
                    "--host", ",".join(f"{h}:{ppn}" for h in hosts),
                    "--mca", "oob_tcp_if_include", f"{self.subnet}.0/24",
                    "--mca", "btl_tcp_if_include", f"{self.subnet}.0/24",
                    "-n", str(nprocs), *command]
        return [exe, "-launcher", "ssh", "-launcher-exec", str(self.wrapper),
                "-hosts", ",".join(hosts), "-ppn", str(ppn), "-iface", self.bridge,
                "-n", str(nprocs), *command]

    def link_bytes(self, host: str) -> int:
        """Bytes sent plus received on `host`'s link so far."""
        stats = Path("/sys/class/net", self.veth(host), "statistics")
        return sum(int((stats / name).read_text()) for name in ("rx_bytes", "tx_bytes"))

    def cut(self, host: str) -> None:
        """Cut `host` off from every other host and from mpiexec: its frames vanish both
        ways and no one is told (no RST, no carrier change) -- a network partition.

        The link leaves the bridge; this machine then still owns the bridge's address,
        and Linux would accept the host's packets for it on the bare link and answer
        its ARP there: strict reverse-path filtering and no ARP answers on that link
        drop those too."""
        veth = self.veth(host)
        _run("ip", "link", "set", veth, "nomaster")
        _sysctl(veth, rp_filter=1, arp_ignore=8)
        (self.state / f"cut-{host}").touch()     # and the wrapper, like ssh, fails

    def heal(self, host: str) -> None:
        """Put `host` back on the bridge."""
        veth = self.veth(host)
        _sysctl(veth, rp_filter=0, arp_ignore=0)
        _run("ip", "link", "set", veth, "master", self.bridge)
        (self.state / f"cut-{host}").unlink(missing_ok=True)

    def processes(self, host: str, pattern: str = "") -> list[int]:
        """Host-local pids of `host`'s processes (its PID 1 excluded) whose command line
        contains `pattern`."""
        res = self.run(host, "ps -eo pid=,args=", timeout=10)
        pids = []
        for line in res.stdout.splitlines():
            pid, _, args = line.strip().partition(" ")
            if pid.isdigit() and int(pid) != 1 and pattern in args and "ps -eo" not in args:
                pids.append(int(pid))
        return pids

    def kill(self, host: str, pattern: str, sig: int = signal.SIGKILL) -> list[int]:
        """Send `sig` to `host`'s processes matching `pattern`; returns their pids."""
        pids = self.processes(host, pattern)
        if pids:
            self.run(host, f"kill -{int(sig)} {' '.join(map(str, pids))}", timeout=10)
        return pids


def _sysctl(iface: str, **values: int) -> None:
    for key, value in values.items():
        Path("/proc/sys/net/ipv4/conf", iface, key).write_text(f"{value}\n")


def sweep(tag: str) -> None:
    """Remove the hosts, links and bridge of set `tag`, and every process on them."""
    prefix = f"pal{tag}"
    res = _run("ip", "netns", "list", check=False)
    for line in res.stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        if ns.startswith(prefix + "h") and ns[len(prefix) + 1:].isdigit():
            pids = _run("ip", "netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _run("ip", "netns", "del", ns, check=False)
    links = _run("ip", "-o", "link", "show", check=False).stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(prefix) and (name.endswith("br") or name[len(prefix):][:1] == "v"):
            _run("ip", "link", "del", name, check=False)
    state = STATE_ROOT / tag
    for path in (state / "ssh", state / "hosts", state / "hosts.json", *state.glob("cut-*")):
        path.unlink(missing_ok=True)
    for path in state.glob("tmp-*"):
        shutil.rmtree(path, ignore_errors=True)
    if state.exists():
        try:
            state.rmdir()
        except OSError:
            pass


def main(argv: list[str] | None = None) -> int:
    """`python -m pal_hpc.cluster.testhosts up N | down | show` (root)."""
    ap = argparse.ArgumentParser(prog="python -m pal_hpc.cluster.testhosts",
                                 description="test hosts as namespaces on this machine")
    ap.add_argument("verb", choices=("up", "down", "show"))
    ap.add_argument("n", nargs="?", type=int, default=2, help="hosts to make (up)")
    ap.add_argument("--tag", default="u", help="name of the set (default u)")
    args = ap.parse_args(argv)
    if args.verb == "down":
        sweep(args.tag)
        return 0
    info = STATE_ROOT / args.tag / "hosts.json"
    if args.verb == "up":
        try:
            hosts = TestHosts(args.n, tag=args.tag).up()
        except (TestHostsError, ValueError) as exc:
            print(f"testhosts: error: {exc}", file=sys.stderr)
            return 1
        for proc in hosts._holders.values():   # the hosts outlive this command
            proc.stderr.close()
    if not info.exists():
        print(f"testhosts: no set {args.tag!r} is up", file=sys.stderr)
        return 1
    data = json.loads(info.read_text())
    print(f"hosts: {', '.join(f'{h} ({a})' for h, a in data['addresses'].items())}")
    print(f"launch: mpiexec -launcher ssh -launcher-exec {data['wrapper']} "
          f"-hosts {','.join(data['names'])} -ppn 2 -iface {data['bridge']} -n "
          f"{2 * len(data['names'])} python -m mpi4py -m pal_hpc.main ...")
    print(f"remove: python -m pal_hpc.cluster.testhosts down --tag {args.tag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
