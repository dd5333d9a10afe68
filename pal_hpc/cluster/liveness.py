"""Asking the job's ranks whether they are alive, over plain UDP (no MPI).

When a collective does not complete, MPI cannot say why: the peer may be slow, dead,
or behind a partition where its packets vanish.  Every rank therefore answers probes
on a UDP socket of its own, on a thread that needs nothing of the rank's main thread
but the GIL: a rank blocked in MPI (which releases the GIL) or computing still answers;
a rank whose host is gone or cut off does not.  The answer says where the rank is
(its main thread's innermost pal_hpc frame) and what it waits for.

`Responder` runs the answering thread; `probe` asks a list of ranks and returns the
answers it got within a few seconds.  Used by `cluster.deadline` when a deadline passes.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence

PROBE = b"PALPROBE "
MAX_ANSWER = 1400            # one unfragmented datagram on an Ethernet link


def local_address(hostname: str | None = None) -> str:
    """The IPv4 address other hosts reach this one at: the host name's address unless
    that is a loopback one (Debian's /etc/hosts maps it to 127.0.1.1), else the address
    the kernel would send from, else 127.0.0.1 (then only this host's ranks answer)."""
    name = hostname or socket.gethostname()
    try:
        for addr in socket.gethostbyname_ex(name)[2]:
            if not addr.startswith("127."):
                return addr
    except OSError:
        pass
    for target in ("10.255.255.255", "192.168.255.255", "172.31.255.255"):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((target, 9))          # UDP connect: routes, sends nothing
                addr = s.getsockname()[0]
            if not addr.startswith("127.") and addr != "0.0.0.0":
                return addr
        except OSError:
            continue
    return "127.0.0.1"


def main_thread_where() -> str:
    """`file:line function` of the main thread's innermost frame in pal_hpc (else its
    innermost frame), as this process runs now."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    inner = frame
    while frame is not None and f"{os.sep}pal_hpc{os.sep}" not in frame.f_code.co_filename:
        frame = frame.f_back
    frame = frame or inner
    if frame is None:
        return "?"
    return f"{_short(frame.f_code.co_filename)}:{frame.f_lineno} {frame.f_code.co_name}"


def _short(path: str) -> str:
    mark = f"{os.sep}pal_hpc{os.sep}"
    return "pal_hpc/" + path.split(mark, 1)[1] if mark in path else os.path.basename(path)


class Responder:
    """Answers probes for this rank on a UDP socket, on a daemon thread.

    `describe()` returns what the answer carries besides rank, host and where the main
    thread is (the deadline's open operations)."""

    def __init__(self, rank: int, host: str, describe: Callable[[], list] = list,
                 address: str | None = None):
        self.rank, self.host, self.describe = rank, host, describe
        self.address = address or local_address()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:                           # only where the peers look for it
            self.sock.bind((self.address, 0))
        except OSError:
            self.sock.bind(("0.0.0.0", 0))
        self.port = self.sock.getsockname()[1]
        self._stop = False
        self._thread = threading.Thread(target=self._serve, name="pal_hpc-liveness",
                                        daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> tuple[str, str, int]:
        """(host name, address, port): what the other ranks need to probe this one."""
        return (self.host, self.address, self.port)

    def _serve(self) -> None:
        self.sock.settimeout(0.5)
        while not self._stop:
            try:
                data, peer = self.sock.recvfrom(256)
            except (socket.timeout, BlockingIOError):
                continue
            except OSError:
                return
            if not data.startswith(PROBE):
                continue
            try:
                self.sock.sendto(self._answer(data[len(PROBE):].decode(errors="replace")), peer)
            except OSError:
                pass

    def _answer(self, nonce: str) -> bytes:
        body = {"nonce": nonce, "rank": self.rank, "host": self.host, "pid": os.getpid(),
                "where": main_thread_where(), "ops": self.describe()}
        raw = json.dumps(body).encode()
        while len(raw) > MAX_ANSWER and body["ops"]:
            body["ops"] = body["ops"][:-1]
            raw = json.dumps(body).encode()
        return raw

    def close(self) -> None:
        """Stop answering (idempotent)."""
        self._stop = True
        try:
            self.sock.close()
        except OSError:
            pass


def probe(targets: Sequence[tuple[int, str, int]], wait: float = 2.0,
          tries: int = 2) -> dict[int, dict]:
    """Ask each (rank, address, port) whether it is alive; returns {rank: its answer}
    for those that answered within `wait` seconds (each asked up to `tries` times)."""
    nonce = secrets.token_hex(4)
    answers: dict[int, dict] = {}
    by_rank = {rank: (addr, port) for rank, addr, port in targets}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(0.05)
        end = time.monotonic() + wait
        for attempt in range(max(tries, 1)):
            for rank, dest in by_rank.items():
                if rank not in answers:
                    try:
                        sock.sendto(PROBE + nonce.encode(), dest)
                    except OSError:
                        pass
            until = time.monotonic() + (end - time.monotonic()) / (max(tries, 1) - attempt)
            while time.monotonic() < until and len(answers) < len(by_rank):
                try:
                    data, _ = sock.recvfrom(MAX_ANSWER + 100)
                except (socket.timeout, BlockingIOError):
                    continue
                except OSError:
                    break
                try:
                    body = json.loads(data)
                except ValueError:
                    continue
                if body.get("nonce") == nonce and body.get("rank") in by_rank:
                    answers[int(body["rank"])] = body
            if len(answers) == len(by_rank):
                break
    return answers
