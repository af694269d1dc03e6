"""Throwaway `redis-server`s on free loopback ports, for tests and benchmarks:
one server, or a Redis Cluster of a few.

No persistence (`--save ""`, `--appendonly no`), data in a given directory, and
the same port across `kill` and `start`, so a client sees a restart.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence

import redis

# Slots of a Redis Cluster (CRC16 of the key, modulo this).
CLUSTER_SLOTS = 16384

_CANDIDATES = (
    "/usr/bin/redis-server",
    "/usr/sbin/redis-server",
    "/usr/local/bin/redis-server",
)


def find_redis_server() -> str | None:
    """Path of a `redis-server` (or `valkey-server`) binary, or `None`."""
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    return next((p for p in _CANDIDATES if os.access(p, os.X_OK)), None)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """Starts and stops one `redis-server` process bound to 127.0.0.1."""

    def __init__(
        self,
        directory: str,
        binary: str | None = None,
        maxmemory: str = "0",
        extra_args: Sequence[str] = (),
    ) -> None:
        found = binary or find_redis_server()
        if found is None:
            raise FileNotFoundError(
                "redis-server not found (apt-get install redis-server)"
            )
        self.binary = found
        self.directory = directory
        self.maxmemory = maxmemory
        self.extra_args = tuple(extra_args)
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        """Start on the previous port (a restart), or on a free one."""
        if self._proc is not None:
            raise RuntimeError("redis-server is already running")
        self.port = self.port or _free_port()
        log = open(os.path.join(self.directory, f"redis-{self.port}.log"), "ab")  # noqa: SIM115
        args = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", "--dir", self.directory,
            "--maxmemory", self.maxmemory, "--maxmemory-policy", "allkeys-lru",
            *self.extra_args,
        ]  # fmt: skip
        with log:
            self._proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        client = redis.Redis(
            port=self.port, socket_timeout=0.5, socket_connect_timeout=0.5
        )
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                try:
                    if client.ping():
                        return
                except (redis.RedisError, OSError):
                    pass
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(
                        f"redis-server did not start on port {self.port}; "
                        f"see {self.directory}/redis-{self.port}.log"
                    )
                time.sleep(0.02)
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL: the server vanishes mid-conversation, as in a crash."""
        if self._proc is None:
            return
        self._proc.send_signal(signal.SIGKILL)
        self._proc.wait()
        self._proc = None

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RedisClusterServers:
    """A Redis Cluster of `num_nodes` masters on loopback, no replicas: each
    node serves an equal range of the slots, joined by `CLUSTER MEET` (no
    `redis-cli` needed). `nodes` are the servers, for tests that kill one."""

    def __init__(
        self, directory: str, num_nodes: int = 3, binary: str | None = None
    ) -> None:
        if num_nodes < 1:
            raise ValueError(f"num_nodes must be >= 1, got {num_nodes!r}")
        self.nodes: list[RedisServer] = []
        self._bus_ports: list[int] = []
        for i in range(num_nodes):
            node_dir = os.path.join(directory, f"node{i}")
            os.makedirs(node_dir, exist_ok=True)
            # The cluster bus defaults to port + 10000, out of range for the
            # high ports the kernel hands out: it gets a free port of its own.
            bus = _free_port()
            self._bus_ports.append(bus)
            args = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", "2000", "--cluster-port", str(bus))  # fmt: skip
            self.nodes.append(RedisServer(node_dir, binary, extra_args=args))

    @property
    def url(self) -> str:
        """Any one node: a cluster client finds the others."""
        return f"redis://127.0.0.1:{self.nodes[0].port}"

    def start(self, timeout_s: float = 20.0) -> None:
        for node in self.nodes:
            node.start()
        clients = [redis.Redis(port=n.port, socket_timeout=2.0) for n in self.nodes]
        try:
            share = -(-CLUSTER_SLOTS // len(self.nodes))
            for i, client in enumerate(clients):
                first = i * share
                last = min(CLUSTER_SLOTS, first + share)
                _command(client, "CLUSTER ADDSLOTS", *range(first, last))
            for node, bus in zip(self.nodes[1:], self._bus_ports[1:], strict=True):
                _command(clients[0], "CLUSTER MEET", "127.0.0.1", node.port, bus)
            deadline = time.monotonic() + timeout_s
            while not all(_cluster_ok(c, len(self.nodes)) for c in clients):
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("the Redis Cluster did not come up in time")
                time.sleep(0.05)
        finally:
            for client in clients:
                client.close()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> RedisClusterServers:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _cluster_ok(client: redis.Redis, num_nodes: int) -> bool:
    """Whether this node sees every slot served and every node known."""
    info = _command(client, "CLUSTER INFO")  # parsed by redis-py into a dict
    if not isinstance(info, dict):
        return False
    return bool(
        str(info.get("cluster_state")) == "ok"
        and str(info.get("cluster_known_nodes")) == str(num_nodes)
    )


def _command(client: redis.Redis, *args: object) -> object:
    """A raw command (redis-py types `execute_command` loosely)."""
    return client.execute_command(*args)  # type: ignore[no-untyped-call]
