"""Separate "servers" on one machine: a network namespace and a pid namespace each.

Each host is a network namespace joined to the root namespace by a veth pair, in a private
/24 of its own (10.A.B.0/24: .1 on the root side, .2 inside). Commands run there through
`ip netns exec NS unshare --pid --fork --mount-proc`, so each host has its own network and its
own process table: to cronops' holder identity (ops/run/process.py) it is another machine (same
kernel boot id, another pid namespace), which can only be judged by its heartbeat.

The shared PostgreSQL listens on 127.0.0.1 only and is never reconfigured: a small TCP
forwarder in the root namespace listens on each host's root-side address and forwards to it.
`Host.cut()` takes the host's link down (its packets are dropped, its connections hang as on a
network partition); `Host.restore()` brings it back.

Used by tests/test_standby_hosts.py and bench/faults/f9_standby.py. Needs root and iproute2.
"""

import os
import random
import select
import shutil
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

NS_PREFIX = "cronops-"


def available() -> str:
    """Why namespaces cannot be used here ("" when they can)."""
    if os.geteuid() != 0:
        return "needs root for network and pid namespaces"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"needs {tool} (iproute2, util-linux)"
    return ""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _used_prefixes() -> set[str]:
    out = _ip("-o", "-4", "addr", "show").stdout + _ip("-4", "route", "show").stdout
    return {".".join(part.split(".")[:3]) for part in out.split() if part.count(".") == 3}


class QueryCounter:
    """Counts the statements a PostgreSQL client sends (frontend protocol 3): each simple
    query ('Q') and each extended-protocol round trip (its 'S', Sync) is one. The untyped
    messages before the StartupMessage (SSLRequest, GSSENCRequest) are skipped."""

    STARTUP = 196608  # protocol 3.0

    def __init__(self):
        self.buffer = b""
        self.started = False
        self.count = 0

    def feed(self, data: bytes) -> None:
        self.buffer += data
        while True:
            if not self.started:
                if len(self.buffer) < 8:
                    return
                length = int.from_bytes(self.buffer[:4], "big")
                if len(self.buffer) < length:
                    return
                code = int.from_bytes(self.buffer[4:8], "big")
                self.started = code == self.STARTUP
            else:
                if len(self.buffer) < 5:
                    return
                length = 1 + int.from_bytes(self.buffer[1:5], "big")
                if len(self.buffer) < length:
                    return
                if self.buffer[:1] in (b"Q", b"S"):
                    self.count += 1
            self.buffer = self.buffer[length:]


class Forwarder:
    """Accepts on (address, port) in the root namespace, forwards each connection to `target`.
    `queries()` is how many statements the clients sent through it (PostgreSQL)."""

    def __init__(self, address: str, target: tuple[str, int]):
        self.target = target
        self.counters: list[QueryCounter] = []
        self.listener = socket.create_server((address, 0))
        self.port = self.listener.getsockname()[1]
        self.socks: list[socket.socket] = []
        self.alive = True
        threading.Thread(target=self._accept, daemon=True, name="forwarder").start()

    def _accept(self) -> None:
        while self.alive:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            self.socks += [client, upstream]
            counter = QueryCounter()
            self.counters.append(counter)
            threading.Thread(
                target=self._pump, args=(client, upstream, counter), daemon=True, name="pump"
            ).start()

    def queries(self) -> int:
        return sum(c.count for c in self.counters)

    def _pump(self, a: socket.socket, b: socket.socket, counter: QueryCounter) -> None:
        peers = {a: b, b: a}
        try:
            while self.alive:
                ready, _, _ = select.select(list(peers), [], [], 0.5)
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is a:
                        counter.feed(data)
                    peers[sock].sendall(data)
        except OSError:
            pass
        finally:
            for sock in (a, b):
                _close(sock)

    def close(self) -> None:
        self.alive = False
        _close(self.listener)
        for sock in self.socks:
            _close(sock)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class Host:
    def __init__(self, network: "Network", index: int, prefix: str):
        tag = network.tag
        self.name = f"host-{index}"
        self.netns = f"{NS_PREFIX}{tag}-{index}"
        self.veth = f"cro{tag[:6]}{index}"  # the root side (at most 15 characters)
        inner = f"cri{tag[:6]}{index}"
        self.root_address, self.address = f"{prefix}.1", f"{prefix}.2"
        _ip("netns", "add", self.netns)
        network.cleanups.append(lambda: _ip("netns", "del", self.netns, check=False))
        _ip("link", "add", self.veth, "type", "veth", "peer", "name", inner)
        network.cleanups.append(lambda: _ip("link", "del", self.veth, check=False))
        _ip("link", "set", inner, "netns", self.netns)
        _ip("addr", "add", f"{self.root_address}/24", "dev", self.veth)
        _ip("link", "set", self.veth, "up")
        inside = ("netns", "exec", self.netns, "ip")
        _ip(*inside, "addr", "add", f"{self.address}/24", "dev", inner)
        _ip(*inside, "link", "set", inner, "up")
        _ip(*inside, "link", "set", "lo", "up")
        self.forwarders: dict[tuple[str, int], Forwarder] = {}
        self.network = network

    def forward(self, host: str, port: int) -> tuple[str, int]:
        """(address, port) by which this host reaches host:port of the root namespace."""
        key = (host, port)
        if key not in self.forwarders:
            forwarder = Forwarder(self.root_address, key)
            self.forwarders[key] = forwarder
            self.network.cleanups.append(forwarder.close)
        return self.root_address, self.forwarders[key].port

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` run on this host: its network namespace, a pid namespace of its own."""
        return [
            *("ip", "netns", "exec", self.netns),
            *("unshare", "--pid", "--fork", "--mount-proc", "--kill-child"),
            *argv,
        ]

    def cut(self) -> None:
        """Pull the cable: the link goes down, the host's packets are dropped."""
        _ip("link", "set", self.veth, "down")

    def restore(self) -> None:
        _ip("link", "set", self.veth, "up")


class Network:
    """Hosts in namespaces of their own; `close()` removes every namespace, veth and forwarder
    it made (also after a failure: use it as a context manager or a finalizer)."""

    def __init__(self):
        self.tag = uuid.uuid4().hex[:8]
        self.cleanups: list = []
        self.hosts: list[Host] = []
        self._prefixes = _used_prefixes()
        self._rng = random.Random(self.tag)

    def _prefix(self) -> str:
        for _ in range(1000):
            prefix = f"10.{self._rng.randint(160, 250)}.{self._rng.randint(0, 255)}"
            if prefix not in self._prefixes:
                self._prefixes.add(prefix)
                return prefix
        raise RuntimeError("no free private /24 for a test host")

    def add_host(self) -> Host:
        host = Host(self, len(self.hosts), self._prefix())
        self.hosts.append(host)
        return host

    def close(self) -> None:
        for cleanup in reversed(self.cleanups):
            try:
                cleanup()
            except Exception:  # best effort: remove everything else
                pass
        self.cleanups.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def inner_pid(proc: subprocess.Popen, timeout: float = 30) -> int:
    """The pid (in the root namespace) of the command a `Host.wrap` Popen runs: unshare's
    child. Signals for "the host's process" (SIGKILL, SIGSTOP) go to it."""
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            found = children.read_text().split()
        except OSError:
            found = []
        if found:
            return int(found[0])
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    raise RuntimeError(f"no child of {proc.pid} (unshare) appeared")
