"""The holder protocol's pieces every Python-run holder shares (holder.py,
run_holder.py and the command under `dlock run`, run_child.py): the clock
of the records, the flags, the history file and the gate's line protocol.
"""

import json
import os
import socket
import sys
import threading
import time

# The holder protocol's numeric flags, with their defaults.
NUMBERS = {"ttl-ms": 4000, "interval-ms": 1000, "timeout-ms": 500, "retry-ms": 250,
           "margin-ms": 1000, "unit-ms": 10, "idle-ms": 5, "writes": 1, "election": 0,
           "semaphore": 0}
# The flags every holder must be given.
WORDS = ("id", "endpoints", "lock", "key", "gate", "history")


def now() -> int:
    """CLOCK_BOOTTIME in nanoseconds, the clock of dlock's deadlines."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def flags(argv, prog, optional):
    """The holder's `--key value` flags: NUMBERS (whole numbers), WORDS
    (required) and `optional` (words that may be left out, with their
    defaults); `prog` names the holder in the exit message of a bad one."""
    f = dict(NUMBERS, **optional)
    if len(argv) % 2:
        sys.exit(f"{prog}: flags are --key value, got {argv!r}")
    for k, v in zip(argv[::2], argv[1::2]):
        if not k.startswith("--") or (k[2:] not in NUMBERS and k[2:] not in WORDS
                                      and k[2:] not in optional):
            sys.exit(f"{prog}: unknown flag {k}")
        k = k[2:]
        if k in NUMBERS:
            if not v.isdigit():
                sys.exit(f"{prog}: --{k} must be a whole number, got {v!r}")
            v = int(v)
        f[k] = v
    missing = [w for w in WORDS if w not in f]
    if missing:
        sys.exit(f"{prog}: --{', --'.join(missing)} required")
    return f


class History:
    """One write(2) per record on a file opened for append: a killed
    process loses nothing it recorded. `tags` go into every record."""

    def __init__(self, path, who, **tags):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        self.who = who
        self.tags = tags
        self.mu = threading.Lock()

    def record(self, ev, **fields):
        line = json.dumps({"t": now(), "p": self.who, "ev": ev, **fields, **self.tags},
                          separators=(",", ":"))
        with self.mu:
            os.write(self.fd, (line + "\n").encode())


class Gate:
    """The gate: one line each way; "ok", "refused", "unknown", "error"."""

    def __init__(self, addr):
        host, port = addr.rsplit(":", 1)
        self.addr = (host, int(port))
        self.conn = None

    def write(self, who, token, seq, li=None):
        return self.send(f"{who} {token} {seq}{'' if li is None else f' {li}'}\n")

    def register(self, who, token, seq, mode):
        """A read ("r") or write ("w") of the two-key register."""
        return self.send(f"{who} {token} {seq} {mode}\n")

    def send(self, request):
        if self.conn is None:
            try:
                s = socket.create_connection(self.addr, timeout=5)
            except OSError:
                return "error"
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.conn = (s, s.makefile("rb"))
        s, r = self.conn
        try:
            s.sendall(request.encode())
            line = r.readline()
        except OSError:
            line = b""
        if line.startswith(b"ok"):
            return "ok"
        if line.startswith(b"stale"):
            return "refused"
        self.conn = None
        s.close()
        return "unknown"
