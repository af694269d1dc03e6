"""The Redis/Valkey tier's configuration: a server, a Sentinel-found master or a
Cluster, its timeouts, namespace and client options, and where secrets come from
(`redis_settings` holds the ranges and the URL, option and secret checks)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from kvoffload.config import parse_size, shown
from kvoffload.config.errors import ErrorList
from kvoffload.tiers.base import OffloadPolicy
from kvoffload.tiers.secondary import redis_settings as rs
from kvoffload.tiers.secondary.base import Locality
from kvoffload.tiers.secondary.config import _from_mapping, check_placement
from kvoffload.tiers.secondary.redis_sentinel import (
    SENTINEL_SCHEMES,
    is_sentinel_url,
    parse_sentinel_url,
)
from kvoffload.tiers.secondary.redis_url import MASK, redact_url, shown_value


def _check_redis_installed() -> None:
    """The Redis tier's client library, named with the extra that installs it."""
    try:
        import redis  # noqa: F401
    except ImportError:
        raise ValueError(
            "type: 'redis' needs the redis-py client library, which is not "
            "installed here: pip install 'kvoffload[redis]' (or pip install redis)"
        ) from None


def _check_redis_url(url: object) -> None:
    """A URL redis-py (or `parse_sentinel_url`) can parse, named in errors
    without its password. The port is checked here because redis-py's error
    for a bad one quotes what it took for the port: part of the password when
    that holds an unescaped `/`, `?` or `#`."""
    if not isinstance(url, str):
        raise ValueError(f"url: {shown_value(url)} is not a string")
    if not url.startswith(_REDIS_SCHEMES):
        raise ValueError(
            f"url: {shown_value(url)} must start with one of {_REDIS_SCHEMES}"
        )
    if is_sentinel_url(url):
        return
    try:
        _ = urlsplit(url).port  # ValueError if it is not a port number
    except ValueError:
        hint = "; percent-encode '/', '?' and '#' in the password" if "@" in url else ""
        raise ValueError(
            f"url: {shown_value(url)}: the port is not a number from 0 to 65535{hint}"
        ) from None


_REDIS_SCHEMES = ("redis://", "rediss://", "unix://", *SENTINEL_SCHEMES)
_MAX_KEY_PREFIX = 1024


def _check_key_prefix(prefix: object) -> None:
    if not isinstance(prefix, str) or not prefix:
        raise ValueError(
            f"key_prefix: {rs.safe_repr(prefix)} must be a non-empty string"
        )
    if len(prefix) > _MAX_KEY_PREFIX:
        raise ValueError(
            f"key_prefix: {rs.safe_repr(prefix)} must be at most "
            f"{_MAX_KEY_PREFIX} characters (it starts every key)"
        )


def _batch_bytes(batch: object) -> int:
    allowed = f"must be from 1 to {rs.MAX_BATCH_BYTES} bytes"
    if type(batch) is int and not 0 < batch <= rs.MAX_BATCH_BYTES:
        # Before parse_size, whose error would repr it.
        raise ValueError(f"batch_bytes: {rs.safe_repr(batch)} {allowed}")
    size = parse_size(batch, "batch_bytes")
    if not 0 < size <= rs.MAX_BATCH_BYTES:
        raise ValueError(f"batch_bytes: {rs.safe_repr(batch)} {allowed}")
    return size


@dataclass(frozen=True, repr=False)
class RedisTierConfig:
    """A Redis or Valkey server, a master found through Redis Sentinel (a
    `redis+sentinel://` URL, see `redis_sentinel`), or with `cluster` a Redis
    Cluster (the URL names any one of its nodes). `options` go to
    `redis.Redis.from_url` (or `RedisCluster.from_url`) as they are
    (`username`, `ssl_ca_certs`, `ssl_certfile`, ...); `rediss://` turns TLS
    on. The URL may be read from an environment variable (`url_env`), and so
    may the password (`password_env`), to keep secrets out of the config an
    engine logs; see `redis_settings` for what each setting allows."""

    url: str = ""
    name: str = "redis"
    timeout_s: float = 0.5
    ttl_s: float | None = None
    key_prefix: str = "kvoffload"
    locality: Locality = "remote"
    offload_policy: OffloadPolicy = OffloadPolicy.CHUNK_LEVEL
    num_threads: int = 4
    max_inflight_chunks: int = 128
    batch_bytes: int = 64 << 20
    hit_cache_s: float = 30.0
    miss_cache_s: float = 1.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    cluster: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)
    url_env: str | None = None
    """Name of an environment variable holding the whole URL (instead of `url`)."""
    password_env: str | None = None
    """Name of an environment variable holding the password."""
    password: str | None = field(default=None, init=False, compare=False)
    """The password read from `password_env`."""

    def __post_init__(self) -> None:
        _check_redis_installed()  # without it, nothing else matters
        # Each check on its own, so that every bad setting is reported at once;
        # the URL's topology and options only with a URL that parsed.
        errors = ErrorList()
        url_ok = False
        with errors.check():
            object.__setattr__(self, "url", rs.resolve_url(self.url, self.url_env))
            _check_redis_url(self.url)
            url_ok = True
        check_placement(self, errors)
        self._check_numbers(errors)
        with errors.check():
            _check_key_prefix(self.key_prefix)
        with errors.check():
            object.__setattr__(self, "batch_bytes", _batch_bytes(self.batch_bytes))
        if url_ok:
            with errors.check():
                self._check_topology()
                self._check_options()
        with errors.check():
            if self.password_env is not None:
                password = rs.read_env("password_env", self.password_env)
                object.__setattr__(self, "password", password)
        errors.raise_if_any()

    def _check_numbers(self, errors: ErrorList) -> None:
        # A socket timeout past what the platform's clock holds raises
        # OverflowError on every call; far less is already a hang.
        with errors.check():
            rs.check_seconds("timeout_s", self.timeout_s, maximum=rs.MAX_TIMEOUT_S)
        for name in ("hit_cache_s", "miss_cache_s"):
            with errors.check():
                rs.check_seconds(name, getattr(self, name), maximum=rs.MAX_CACHE_S)
        valid_backoffs = 0
        for name in ("backoff_initial_s", "backoff_max_s"):
            with errors.check():
                rs.check_seconds(name, getattr(self, name), maximum=rs.MAX_BACKOFF_S)
                valid_backoffs += 1
        with errors.check():
            if valid_backoffs == 2:  # their order only compares two numbers
                self._check_backoff_order()
        with errors.check():
            rs.check_seconds("ttl_s", self.ttl_s, maximum=rs.MAX_TTL_S, allow_none=True)
        threads_ok = False
        with errors.check():
            rs.check_count("num_threads", self.num_threads, 1, rs.MAX_THREADS)
            threads_ok = True
        with errors.check():
            rs.check_count("max_inflight_chunks", self.max_inflight_chunks, 1, 1 << 24)
        with errors.check():
            if threads_ok:
                self._check_max_connections()

    def _check_backoff_order(self) -> None:
        if self.backoff_max_s < self.backoff_initial_s:
            # Named by the setting the user changed: either may be the default.
            if self.backoff_max_s == RedisTierConfig.backoff_max_s:
                raise ValueError(
                    f"backoff_initial_s: {self.backoff_initial_s!r} must be <= "
                    f"backoff_max_s ({self.backoff_max_s!r})"
                )
            raise ValueError(
                f"backoff_max_s: {shown(self.backoff_max_s)} must be >= "
                f"backoff_initial_s ({shown(self.backoff_initial_s)})"
            )

    def _check_max_connections(self) -> None:
        # The pool's connections serve the I/O threads, the lookup thread and
        # a reset's: fewer fail calls with "Too many connections", which reads
        # as a server that is down.
        least = self.num_threads + 2
        limit = (
            self.options.get("max_connections")
            if isinstance(self.options, Mapping)
            else None
        )
        if limit is not None and (type(limit) is not int or limit < least):
            raise ValueError(
                f"options: max_connections {rs.safe_repr(limit)} must be an int "
                f">= num_threads + 2 ({least}): one connection per I/O thread, "
                "plus the lookup and reset threads"
            )

    def _check_topology(self) -> None:
        if not isinstance(self.cluster, bool):
            raise ValueError(
                f"cluster: {rs.safe_repr(self.cluster)} must be true or false"
            )
        if is_sentinel_url(self.url):
            parse_sentinel_url(self.url)  # raises ValueError saying what is wrong
            if self.cluster:
                raise ValueError(
                    "cluster: a Redis Cluster is not reached through sentinels; "
                    "give one node's redis:// URL"
                )
        if self.cluster and self.url.startswith("unix://"):
            raise ValueError(
                "cluster: a Redis Cluster is reached over TCP, not unix://"
            )

    def _check_options(self) -> None:
        if not isinstance(self.options, Mapping):
            raise ValueError(  # the type only: the value may hold a password
                f"options: a value of type {type(self.options).__name__} is not "
                "a mapping of option names to values"
            )
        # The keys only: the values may hold a password.
        not_names = [k for k in self.options if not isinstance(k, str)]
        if not_names:
            raise ValueError(f"options: keys {not_names!r} are not option names")
        rs.check_url(self.url, self.cluster)
        rs.check_options(self.options, self.url, self.cluster, self.password_env)
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    def secrets(self) -> tuple[str, ...]:
        """Every password this config holds, to mask in logs and errors."""
        return rs.secrets_of(self.url, self.options, self.password)

    def __repr__(self) -> str:
        # Never a password: the URL masked, option values by their names only.
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.repr}
        values["url"] = redact_url(self.url)
        values["options"] = sorted(self.options)
        values["password"] = None if self.password is None else MASK
        inner = ", ".join(f"{name}={value!r}" for name, value in values.items())
        return f"RedisTierConfig({inner})"

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> RedisTierConfig:
        return _from_mapping(cls, "redis", mapping)
