"""Throwaway Redis topologies on loopback, for tests and benchmarks: a Redis
Cluster of a few masters, and a master with a replica watched by a sentinel.
"""

from __future__ import annotations

import os
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Self

import redis

from kvoffload.tiers.secondary.redis_server import RedisServer, free_port

# Slots of a Redis Cluster (CRC16 of the key, modulo this).
CLUSTER_SLOTS = 16384


class _Processes(ABC):
    """Processes started together: `start` stops whatever had started if any
    step fails; as a context manager, started on entry and stopped on exit."""

    def start(self, timeout_s: float = 20.0) -> None:
        try:
            self._start(timeout_s)
        except BaseException:
            self.stop()
            raise

    @abstractmethod
    def _start(self, timeout_s: float) -> None: ...

    @abstractmethod
    def stop(self) -> None:
        """Stop what is running; safe after a partial start."""

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RedisClusterServers(_Processes):
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
            bus = free_port()
            self._bus_ports.append(bus)
            args = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", "2000", "--cluster-port", str(bus))  # fmt: skip
            self.nodes.append(RedisServer(node_dir, binary, extra_args=args))

    @property
    def url(self) -> str:
        """Any one node: a cluster client finds the others."""
        return f"redis://127.0.0.1:{self.nodes[0].port}"

    def _start(self, timeout_s: float) -> None:
        """Start the nodes and join them."""
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
            _poll(
                lambda: all(_cluster_ok(c, len(self.nodes)) for c in clients),
                timeout_s,
                "the Redis Cluster did not come up",
            )
        finally:
            for client in clients:
                client.close()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


class RedisSentinelServers(_Processes):
    """A master, one replica and one sentinel (quorum 1) watching them as
    `service`; the sentinel declares a master down after `down_after_ms`, so a
    `kill` of the master fails over to the replica within a few seconds."""

    def __init__(
        self,
        directory: str,
        service: str = "kvoffload",
        down_after_ms: int = 1000,
        binary: str | None = None,
    ) -> None:
        self.directory = directory
        self.service = service
        self.down_after_ms = down_after_ms
        self.master = RedisServer(os.path.join(directory, "master"), binary)
        self.replica: RedisServer | None = None
        self.sentinel_port = 0
        self._binary = self.master.binary
        self._sentinel: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel_port}/{self.service}"

    def _start(self, timeout_s: float) -> None:
        """Start the master, the replica and the sentinel."""
        os.makedirs(self.master.directory, exist_ok=True)
        self.master.start()
        replica_dir = os.path.join(self.directory, "replica")
        os.makedirs(replica_dir, exist_ok=True)
        self.replica = RedisServer(
            replica_dir,
            self._binary,
            extra_args=("--replicaof", "127.0.0.1", str(self.master.port)),
        )
        self.replica.start()
        self.sentinel_port = free_port()
        conf = os.path.join(self.directory, "sentinel.conf")
        with open(conf, "w") as f:  # the sentinel rewrites it as it learns
            f.write(
                f"port {self.sentinel_port}\nbind 127.0.0.1\n"
                f"dir {self.directory}\n"
                f"sentinel monitor {self.service} 127.0.0.1 {self.master.port} 1\n"
                f"sentinel down-after-milliseconds {self.service} "
                f"{self.down_after_ms}\n"
                f"sentinel failover-timeout {self.service} 3000\n"
            )
        log = open(os.path.join(self.directory, "sentinel.log"), "ab")  # noqa: SIM115
        with log:
            self._sentinel = subprocess.Popen(
                [self._binary, conf, "--sentinel"], stdout=log, stderr=subprocess.STDOUT
            )
        # Ready once the sentinel has found the replica (from the master's INFO).
        self.wait_for(lambda c: bool(_command(c, "SENTINEL REPLICAS", self.service)),
                      timeout_s)  # fmt: skip

    def wait_for_master(self, port: int, timeout_s: float) -> None:
        """Wait until the sentinel names the server on `port` as the master."""

        def named(client: redis.Redis) -> bool:
            addr = _command(client, "SENTINEL GET-MASTER-ADDR-BY-NAME", self.service)
            return (
                isinstance(addr, list | tuple)
                and len(addr) == 2
                and (int(addr[1]) == port)
            )

        self.wait_for(named, timeout_s)

    def wait_for(self, ready: Callable[[redis.Redis], bool], timeout_s: float) -> None:
        """Poll the sentinel until `ready(client)` is true."""
        client = redis.Redis(port=self.sentinel_port, socket_timeout=1.0)
        try:
            _poll(
                lambda: ready(client),
                timeout_s,
                f"the sentinel was not ready (see {self.directory}/sentinel.log)",
            )
        finally:
            client.close()

    def stop(self) -> None:
        if self._sentinel is not None:
            self._sentinel.terminate()
            self._sentinel.wait(timeout=5)
            self._sentinel = None
        for server in (self.master, self.replica):
            if server is not None:
                server.stop()


def _poll(ready: Callable[[], bool], timeout_s: float, failure: str) -> None:
    """Call `ready` every 50 ms until it is true (a Redis error counts as not
    yet); `RuntimeError(failure)` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if ready():
                return
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{failure} in {timeout_s}s")
        time.sleep(0.05)


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
