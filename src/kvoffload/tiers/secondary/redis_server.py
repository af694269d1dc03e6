"""A throwaway `redis-server` on a free loopback port, for tests and benchmarks
(`redis_topologies` builds clusters and sentinel set-ups from it).

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


def free_port() -> int:
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
        self.port = self.port or free_port()
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
