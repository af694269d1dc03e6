"""The Redis tier's connection: a client with timeouts, health and backoff.

Every call has the configured socket timeout and no client-side retry. The first
failure after a success marks the server down for a backoff period that doubles
up to a cap; while down, the tier answers misses and drops stores without calling
the server, and so do the calls already queued on its I/O threads (`attempt`):
once one call has timed out, the others fail at once instead of each waiting out
its own timeout. When the period ends, one call is the probe while the others
still fail at once: its success resets the backoff, its failure doubles it. An
error reply (a full server's OOM, an ACL's NOPERM) fails only its own command:
the server that sent it is up.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import logging
import math
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import redis
import redis.connection
from redis.backoff import NoBackoff
from redis.client import Pipeline
from redis.cluster import (
    KWARGS_DISABLED_KEYS,
    REDIS_ALLOWED_KEYS,
    ClusterPipeline,
    RedisCluster,
)
from redis.connection import parse_url
from redis.retry import Retry
from redis.sentinel import Sentinel

from kvoffload.tiers.secondary.base import Clock
from kvoffload.tiers.secondary.redis_config import RedisTierConfig
from kvoffload.tiers.secondary.redis_sentinel import is_sentinel_url, parse_sentinel_url
from kvoffload.tiers.secondary.redis_url import redact_text, redact_url

logger = logging.getLogger(__name__)

# What a failed call raises. RedisClusterException (a cluster that cannot be
# reached, a slot no node serves) is not a RedisError.
REDIS_ERRORS = (redis.RedisError, redis.exceptions.RedisClusterException, OSError)


def is_error_reply(exc: BaseException) -> bool:
    """Whether `exc` is a server's error reply to one command (out of memory,
    no permission, ...): the call failed, but the server is up and answering.
    A cluster that says it is down (CLUSTERDOWN, MASTERDOWN) is down."""
    return isinstance(exc, redis.ResponseError) and not isinstance(
        exc, redis.exceptions.ClusterDownError
    )


@functools.cache
def client_option_names(cluster: bool) -> frozenset[str]:
    """The keyword arguments the tier's client takes in the installed redis-py
    version: a `RedisCluster` (with `cluster`), which passes on to its nodes
    only the connection settings it knows and drops any other silently, or a
    `redis.Redis`, its pool and connections, which hand unknown ones to each
    new connection (a TypeError on every call)."""
    conn = redis.connection
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)

    def taken(*takers: Any) -> set[str]:
        return {
            p.name
            for taker in takers
            for p in inspect.signature(taker.__init__).parameters.values()
            if p.kind in named
        } - {"self"}

    if cluster:
        passed = set(REDIS_ALLOWED_KEYS) - set(KWARGS_DISABLED_KEYS)
        return frozenset(taken(RedisCluster) | passed)
    classes = ("AbstractConnection", "Connection", "SSLConnection")
    connections = [getattr(conn, name) for name in classes if hasattr(conn, name)]
    plain = taken(redis.Redis, conn.ConnectionPool, *connections)
    return frozenset(plain | taken(conn.UnixDomainSocketConnection))


def check_client_option_names(names: Iterable[str], cluster: bool, where: str) -> None:
    """`ValueError` naming the first of `names` the tier's client does not
    take (`sentinel_kwargs` is the tier's own; see `redis_settings`)."""
    known = client_option_names(cluster) | {"sentinel_kwargs"}
    for name in sorted(names):
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            client = "RedisCluster (cluster: true)" if cluster else "redis.Redis"
            raise ValueError(
                f"{where}: {name!r} is not an option of redis-py's client "
                f"{client} or its connections{hint}"
            )


_AUTH_HINT = (
    " (the server refused the credentials: check the user and password in the "
    "url, options or the variable password_env names)"
)


class RedisLink:
    """A redis-py client plus an up/down state driven by call outcomes.

    A plain client connects on its first call. So does one whose master the
    sentinels name (`redis+sentinel://`): it asks them on every new connection,
    so after a failover the next call reaches the new master. A `RedisCluster`
    (`cluster`) asks the node in the URL for the slot map when it is made, so it
    is made on first use, on an I/O thread, where a failure is a failed call
    like any other (a cluster that is down at start-up gives misses, not an
    engine that does not start); its URL is parsed here, so a malformed one
    still stops start-up."""

    def __init__(self, config: RedisTierConfig, clock: Clock) -> None:
        self._config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._connect_lock = threading.Lock()
        self._client: redis.Redis | RedisCluster | None = None
        self._secrets = config.secrets()
        try:
            if config.cluster:
                parse_url(config.url)  # type: ignore[no-untyped-call]
            else:
                self._client = self._connect()
        except (ValueError, TypeError) as exc:
            # Not chained: redis-py's message may quote the URL or an option.
            raise ValueError(
                f"url: {redact_url(config.url)!r} or options: {self.redact(exc)}"
            ) from None
        self._down_until = 0.0
        self._down = False
        self._probing = False  # a call is probing a server that was down
        self._backoff = config.backoff_initial_s
        self._warned: dict[str, float] = {}
        self.failures = 0
        """Calls that failed with the server down (connection lost, timeout,
        a cluster down); not error replies."""

    @property
    def client(self) -> redis.Redis | RedisCluster:
        """The client, made on first use; raises what a failed call raises."""
        client = self._client
        if client is None:
            with self._connect_lock:
                if self._client is None:
                    self._client = self._connect()
                client = self._client
        return client

    def redact(self, exc: BaseException | str) -> str:
        """`exc`'s message (or a text) without this tier's secrets."""
        return redact_text(str(exc), self._secrets)

    def _connect(self) -> redis.Redis | RedisCluster:
        config = self._config
        common = {
            "socket_timeout": config.timeout_s,
            "socket_connect_timeout": config.timeout_s,
            "retry": Retry(NoBackoff(), 0),  # no client-side retries: a miss
            **dict(config.options),
        }
        if config.password is not None:  # from password_env
            common["password"] = config.password
        if config.cluster:
            return RedisCluster.from_url(config.url, **common)
        plain = {"retry_on_timeout": False, "health_check_interval": 0, **common}
        if is_sentinel_url(config.url):
            return _master_through_sentinels(config, plain)
        return redis.Redis.from_url(config.url, **plain)

    def available(self) -> bool:
        """Whether to call the server now (up, or due for a probe)."""
        return self._clock() >= self._down_until

    @contextmanager
    def attempt(self) -> Iterator[bool]:
        """On an I/O thread, around a call: yields whether to make it. Yes
        while the server is up; while it is down, no (fail at once, as if the
        call had failed) until the backoff is over, then yes for one call at a
        time, the probe, whose outcome (`succeeded` or `failed`) decides."""
        probe = False
        with self._lock:
            if not self._down:
                allowed = True
            elif self._probing or self._clock() < self._down_until:
                allowed = False
            else:
                allowed = probe = self._probing = True
        try:
            yield allowed
        finally:
            if probe:
                with self._lock:
                    self._probing = False

    def is_down(self) -> bool:
        """Whether the last call failed and no call has succeeded since."""
        return self._down

    def succeeded(self) -> None:
        if not self._down:
            return
        with self._lock:
            if self._down:
                logger.info("redis tier %s: server reachable again", self._config.name)
            self._down = False
            self._backoff = self._config.backoff_initial_s

    def execute(self, pipe: Pipeline | ClusterPipeline) -> list[Any]:
        """Run a pipeline of independent commands: their replies in order, an
        exception in place of each command that failed. Error replies (see
        `is_error_reply`) are `refused`; any other failure of a command (a
        cluster node lost) marks the server down, as does a pipeline that
        fails as a whole (raises what it raised; see `call_failed`)."""
        replies: list[Any] = pipe.execute(raise_on_error=False)
        errors = [r for r in replies if isinstance(r, Exception)]
        lost = [e for e in errors if not is_error_reply(e)]
        if lost:
            self.failed(lost[0])
        else:
            self.succeeded()
        for exc in errors:
            if is_error_reply(exc):
                self.refused(exc)
        return replies

    def call_failed(self, exc: BaseException) -> None:
        """A call raised `exc`: `refused` for an error reply (the server is up),
        `failed` for anything else."""
        if is_error_reply(exc):
            self.succeeded()
            self.refused(exc)
        else:
            self.failed(exc)

    def refused(self, exc: BaseException) -> None:
        """The server answered a command with an error reply: nothing backs
        off, since the server is up. A warning per kind of reply (out of
        memory, no permission, ...) at most every `backoff_max_s`, so that a
        full server, refusing every store, does not flood the log."""
        kind = type(exc).__name__
        now = self._clock()
        with self._lock:
            last = self._warned.get(kind, -math.inf)
            due = now - last >= self._config.backoff_max_s
            if due:
                self._warned[kind] = now
        logger.log(
            logging.WARNING if due else logging.DEBUG,
            "redis tier %s: %s refused a command: %s",
            self._config.name,
            redact_url(self._config.url),
            self.redact(exc),
        )

    def failed(self, exc: BaseException) -> None:
        """The server is down (or unreachable, or slow): back off."""
        with self._lock:
            self.failures += 1
            now = self._clock()
            if now < self._down_until:
                return  # already backing off: calls in flight failing together
            logger.warning(
                "redis tier %s: %s: %s%s; lookups miss and stores drop for %.1fs",
                self._config.name,
                redact_url(self._config.url),
                self.redact(exc),
                _AUTH_HINT if isinstance(exc, redis.AuthenticationError) else "",
                self._backoff,
            )
            self._down = True
            self._down_until = now + self._backoff
            self._backoff = min(2 * self._backoff, self._config.backoff_max_s)

    def close(self) -> None:
        if self._client is None:
            return
        try:
            self._client.close()
        except REDIS_ERRORS as exc:
            logger.debug(
                "redis tier %s: close: %s", self._config.name, self.redact(exc)
            )


def _master_through_sentinels(
    config: RedisTierConfig, kwargs: dict[str, object]
) -> redis.Redis:
    """A client of the master the sentinels in the URL name (nothing is asked
    until the first call). `options["sentinel_kwargs"]` go to the sentinels."""
    address = parse_sentinel_url(config.url)
    master = {**kwargs, **address.master_kwargs()}
    own = master.pop("sentinel_kwargs", None) or {}
    if not isinstance(own, dict):
        raise ValueError(
            f"options: sentinel_kwargs is a {type(own).__name__}; expected a "
            "mapping of the sentinels' connection settings"
        )
    sentinels = Sentinel(  # type: ignore[no-untyped-call]
        list(address.sentinels),
        sentinel_kwargs={
            "socket_timeout": config.timeout_s,
            "socket_connect_timeout": config.timeout_s,
            # As for the master: redis-py's default retries a timed-out call
            # three times, reconnecting after a backoff (seconds in all).
            "retry": Retry(NoBackoff(), 0),
            **own,
        },
    )
    client: redis.Redis = sentinels.master_for(address.service, **master)  # type: ignore[no-untyped-call]
    return client
