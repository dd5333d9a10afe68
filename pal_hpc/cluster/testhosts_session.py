"""One "ssh session" on a test host: the far end of the test hosts' ssh stand-in.

`python -I testhosts_session.py PID TMPDIR COMMAND` runs the shell COMMAND inside the
namespaces of the test host whose PID 1 is PID (seen from this machine), the way ssh
runs a command on a node -- and, like ssh, it stands between the command and whoever
launched it, which an `exec nsenter ...` does not:

- The command's output comes through pipes that this process relays to its own
  stdout and stderr.  Nothing on the host holds the launcher's pipes; when this
  process goes, they close, as an ssh client's connection does.
- When this process is killed before the command ends, the command and everything it
  started are killed too, as sshd ends a session whose connection dropped (the
  "session reaper" below).  A second, quiet process waits for that.

Why it matters: Open MPI's mpiexec, giving up on a host it cannot reach, SIGKILLs the
"ssh" of every host whose daemon has not reported back yet and exits at once.  With the
daemon started by `exec nsenter`, that daemon lived on inside its host, still holding
mpiexec's stdout and stderr: the caller, reading them to the end, waited another 60 s
to minutes for a job that had failed in one second (tests/test_multihost.py, under
load, once in about six runs).

Standard library only, and run by path (`-I`: no site, no PYTHON* variables), so any
interpreter of the machine can be the one that runs it.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of `pid`, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return int(fields[1]), int(fields[19])


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                kids.setdefault(st[0], []).append(int(name))
    return kids


def end_session(root: int, started: int) -> list[int]:
    """Kill `root` (if it is still the process that started at `started`) and all its
    descendants; returns their pids.  Each is stopped first, so none can fork a child
    that the kill would miss; then all of them are killed."""
    st = _stat(root)
    if st is None or st[1] != started:
        return []
    stopped: list[int] = []
    seen: set[int] = set()
    while True:
        kids = _children()
        todo, tree = [root], []
        while todo:
            pid = todo.pop()
            tree.append(pid)
            todo.extend(kids.get(pid, ()))
        new = [p for p in tree if p not in seen]
        if not new:
            break
        for pid in new:
            seen.add(pid)
            try:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
            except ProcessLookupError:
                pass
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return stopped


def _reaper(watch: int) -> None:
    """The session reaper: away from every pipe of the launcher, wait until the session
    process is gone (the read end of `watch` sees end of file), then end what it
    started unless it ended by itself."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.closerange(3, watch)
    os.closerange(watch + 1, 65536)
    os.setsid()                         # not in the launcher's process group
    data = b""
    while chunk := os.read(watch, 64):
        data += chunk
    if data.strip():
        root, started = map(int, data.split())
        end_session(root, started)


def _relay(proc: subprocess.Popen) -> None:
    """Copy the command's stdout and stderr to ours until both end."""
    sel = selectors.DefaultSelector()
    for src, dst in ((proc.stdout, 1), (proc.stderr, 2)):
        os.set_blocking(src.fileno(), False)
        sel.register(src.fileno(), selectors.EVENT_READ, dst)
    while sel.get_map():
        for key, _ in sel.select():
            try:
                data = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            if not data:
                sel.unregister(key.fd)
                continue
            view = memoryview(data)
            while view and key.data >= 0:
                try:
                    view = view[os.write(key.data, view):]
                except BlockingIOError:
                    time.sleep(0.001)
                except BrokenPipeError:     # our reader is gone: drain, drop the rest
                    sel.modify(key.fd, selectors.EVENT_READ, -1)
                    break


def main(argv: list[str]) -> int:
    if len(argv) != 3 or not argv[0].isdigit():
        print("usage: testhosts_session.py HOST_PID TMPDIR COMMAND", file=sys.stderr)
        return 2
    host_pid, tmpdir, command = argv
    watch_r, watch_w = os.pipe()
    if os.fork() == 0:
        try:
            os.close(watch_w)
            _reaper(watch_r)
        finally:
            os._exit(0)
    os.close(watch_r)
    proc = subprocess.Popen(
        ["nsenter", "-t", host_pid, "-n", "-u", "-i", "-m", "-p", "--",
         "env", f"TMPDIR={tmpdir}", "/bin/sh", "-c", command],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, close_fds=True)
    st = _stat(proc.pid)
    if st is not None:
        os.write(watch_w, f"{proc.pid} {st[1]}\n".encode())
    try:
        _relay(proc)
    finally:
        code = proc.wait()
    # watch_w closes as this process exits: the reaper finds the session gone and leaves.
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
