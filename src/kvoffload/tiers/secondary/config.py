"""Frozen, validated configurations of the secondary tiers, built once at the edge.

`from_mapping` takes the dict a user writes in `secondary_tiers`, for example
`{"type": "file", "path": "/nvme/kv", "capacity": "500GiB"}` or
`{"type": "redis", "url": "redis://cache:6379/0"}`; an unknown key is an error
that lists the valid ones.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from types import MappingProxyType
from typing import Any, TypeVar
from urllib.parse import urlsplit

from kvoffload.config import config_mapping, finite_seconds, is_count, parse_size, shown
from kvoffload.config.errors import ErrorList, unknown_key
from kvoffload.config.request_params import LOCALITIES, MEDIA
from kvoffload.policies import get_policy_class
from kvoffload.tiers.base import OffloadPolicy
from kvoffload.tiers.secondary import redis_settings as rs
from kvoffload.tiers.secondary.base import Locality
from kvoffload.tiers.secondary.file_access import FILE_MODES, PRIVATE_FILE_MODE
from kvoffload.tiers.secondary.redis_sentinel import (
    SENTINEL_SCHEMES,
    is_sentinel_url,
    parse_sentinel_url,
)
from kvoffload.tiers.secondary.redis_url import MASK, redact_url, shown_value

C = TypeVar("C")

# Fields whose mapping key differs from the field name.
_MAPPING_KEY = {"capacity_bytes": "capacity"}


def _from_mapping(cls: type[C], tier_type: str, mapping: Mapping[str, Any]) -> C:
    """The config of `mapping`; every unknown and missing key, and every bad
    value `cls` finds, reported together (`ConfigError`)."""
    # Not the fields made from others (a password read from the environment).
    all_fields = [f for f in fields(cls) if f.init]  # type: ignore[arg-type]
    by_key = {_MAPPING_KEY.get(f.name, f.name): f.name for f in all_fields}
    errors = ErrorList()
    kwargs: dict[str, Any] = {}
    for key, value in config_mapping(
        mapping, f"{tier_type} tier", bare_keys=True
    ).items():
        if key == "type":
            if value != tier_type:
                errors.add(f"type: {shown(value)} given to the {tier_type} tier config")
        elif key in by_key:
            kwargs[by_key[key]] = value
        else:
            errors.add(unknown_key(f"{tier_type} tier", key, ["type", *by_key]))
    missing = [
        _MAPPING_KEY.get(f.name, f.name)
        for f in all_fields
        if f.name not in kwargs
        and f.default is MISSING
        and f.default_factory is MISSING
    ]
    config: C | None = None
    if missing:
        errors.add(f"{tier_type} tier: missing required key(s) {missing}")
    else:
        with errors.check():
            config = cls(**kwargs)
    errors.raise_if_any()
    assert config is not None
    return config


# Names the stats and Prometheus metrics already use as a tier: host memory
# (`cpu`) and the connector's own counters (`connector`). A secondary tier of
# either name would have its metrics mixed with, or overwritten by, theirs.
RESERVED_NAMES = ("cpu", "connector")


def _check_name(name: object) -> None:
    """A name `kv_load_tiers`/`kv_store_tiers` can select, and select alone:
    entries are also media and localities, `medium:locality`, and a string of
    them is split at commas and stripped. Not one of `RESERVED_NAMES`."""
    if name in RESERVED_NAMES:
        raise ValueError(
            f"name: {shown(name)} is reserved for host memory and the connector in "
            f"stats and metrics; reserved: {RESERVED_NAMES}"
        )
    if (
        not isinstance(name, str)
        or not name
        or name in MEDIA
        or name in LOCALITIES
        or ":" in name
        or "," in name
        or name != name.strip()
    ):
        raise ValueError(
            f"name: {shown(name)} must be a non-empty string other than a medium "
            f"{MEDIA} or locality {LOCALITIES}, without ':' or ',' and without "
            "spaces at its ends"
        )


def _check_int(
    value: object, field_name: str, minimum: int, maximum: int | None = None
) -> None:
    too_big = maximum is not None and type(value) is int and value > maximum
    if not is_count(value, minimum) or too_big:
        allowed = f"an int >= {minimum}" + (
            f" and <= {maximum:,}" if maximum is not None else " (up to 2**63 - 1)"
        )
        raise ValueError(f"{field_name}: {shown(value)} must be {allowed}")


def _check_seconds(
    value: object,
    field_name: str,
    allow_none: bool = False,
    maximum: float = math.inf,
) -> None:
    if value is None and allow_none:
        return
    seconds = finite_seconds(value)
    if seconds is None or seconds <= 0 or seconds > maximum:
        allowed = "a positive number of seconds"
        if maximum < math.inf:
            allowed += f" up to {maximum:.0f}"
        if allow_none:
            allowed += " or null"
        raise ValueError(f"{field_name}: {shown(value)} must be {allowed}")


def _check_locality(value: object) -> None:
    if value not in LOCALITIES:
        raise ValueError(f"locality: {shown(value)} must be one of {LOCALITIES}")


def _offload_policy(value: object) -> OffloadPolicy:
    if isinstance(value, OffloadPolicy):
        return value
    try:
        return OffloadPolicy(value)
    except ValueError:
        raise ValueError(
            f"offload_policy: {shown(value)} must be one of "
            "'chunk_level' (alias 'block_level') or 'request_level'"
        ) from None


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


def _check_eviction_policy(value: object) -> None:
    get_policy_class(value)  # type: ignore[arg-type]  # raises a naming ValueError


MAX_CAPACITY_BYTES = 2**63 - 1
"""The most bytes a file system holds (8 EiB): what a file offset can address."""
MAX_FILE_THREADS = 256
MAX_INFLIGHT_CHUNKS = 1 << 20
RESCAN_INTERVAL_RANGE_S = (1.0, 86400.0)
"""A rescan walks the whole directory: more often than once a second it is a
busy loop on its thread for any directory of size (`1e-300`: rescans back to
back), and other engines' chunks are found within a second anyway; less often
than daily, a directory shared for caching is hardly shared (0 turns it off)."""


def _check_rescan_interval(value: object) -> None:
    # False == 0: a bool is checked (and refused) like any other value.
    if value == 0 and not isinstance(value, bool):
        return
    lowest, highest = RESCAN_INTERVAL_RANGE_S
    seconds = finite_seconds(value)
    if seconds is None or not lowest <= seconds <= highest:
        raise ValueError(
            f"rescan_interval_s: {shown(value)} must be a positive number "
            f"of seconds from {lowest:.0f} to {highest:.0f}, or 0 for no rescans"
        )


def _file_mode(value: object) -> int:
    """`file_mode` as an int: one of `FILE_MODES`, as a string ('0600') or an
    int (0o600, which JSON can only write as 384)."""
    if isinstance(value, str) and value in FILE_MODES:
        return FILE_MODES[value]
    if type(value) is int and value in FILE_MODES.values():
        return value
    raise ValueError(
        f"file_mode: {shown(value)} must be '0600' (this user only) or "
        "'0660' (this user and the directory's group, for engines of several "
        "users sharing it)"
    )


def _check_path(path: object) -> None:
    if not isinstance(path, str) or not path or "\0" in path:
        raise ValueError(
            f"path: {shown(path)} must be a non-empty directory path "
            "(without NUL characters)"
        )


def _capacity(value: object) -> int:
    capacity = parse_size(value, "capacity")
    if not 0 < capacity <= MAX_CAPACITY_BYTES:
        raise ValueError(
            f"capacity: {shown(value)} must be > 0 bytes and at "
            f"most {MAX_CAPACITY_BYTES:,} (8 EiB)"
        )
    return capacity


@dataclass(frozen=True)
class FileTierConfig:
    """A directory of chunk files with a byte capacity (`capacity` in mappings)."""

    path: str
    capacity_bytes: int
    eviction_policy: str = "lru"
    name: str = "file"
    locality: Locality = "local"
    offload_policy: OffloadPolicy = OffloadPolicy.CHUNK_LEVEL
    num_threads: int = 4
    max_inflight_chunks: int = 256
    fsync: bool = False
    """fsync each file before its rename: survives power loss, not just a crash."""
    rescan_interval_s: float = 0.0
    """Seconds between rescans of the directory for chunk files that other engines
    wrote into it (a directory shared between engines); 0: never (the directory is
    this engine's alone after start)."""
    file_mode: int = PRIVATE_FILE_MODE
    """Mode of the chunk files, 0600 or 0660 (`"0600"`, `"0660"` in mappings);
    directories get 0700 or 0770. Whatever the umask (see `file_access`)."""

    def __post_init__(self) -> None:
        # Each check on its own: every bad setting is reported at once.
        errors = ErrorList()
        with errors.check():
            _check_path(self.path)
        with errors.check():
            object.__setattr__(self, "capacity_bytes", _capacity(self.capacity_bytes))
        with errors.check():
            _check_eviction_policy(self.eviction_policy)
        with errors.check():
            _check_name(self.name)
        with errors.check():
            _check_locality(self.locality)
        with errors.check():
            policy = _offload_policy(self.offload_policy)
            object.__setattr__(self, "offload_policy", policy)
        with errors.check():
            _check_int(self.num_threads, "num_threads", 1, MAX_FILE_THREADS)
        with errors.check():
            _check_int(
                self.max_inflight_chunks, "max_inflight_chunks", 1, MAX_INFLIGHT_CHUNKS
            )
        with errors.check():
            if not isinstance(self.fsync, bool):
                raise ValueError(f"fsync: {shown(self.fsync)} must be true or false")
        with errors.check():
            _check_rescan_interval(self.rescan_interval_s)
        with errors.check():
            object.__setattr__(self, "file_mode", _file_mode(self.file_mode))
        errors.raise_if_any()

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> FileTierConfig:
        return _from_mapping(cls, "file", mapping)


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
        with errors.check():
            _check_name(self.name)
        self._check_numbers(errors)
        with errors.check():
            _check_key_prefix(self.key_prefix)
        with errors.check():
            _check_locality(self.locality)
        with errors.check():
            policy = _offload_policy(self.offload_policy)
            object.__setattr__(self, "offload_policy", policy)
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


@dataclass(frozen=True)
class MemoryTierConfig:
    """An in-process dict of chunks: the reference tier for tests and simulation."""

    capacity_chunks: int
    eviction_policy: str = "lru"
    name: str = "memory"
    locality: Locality = "local"
    offload_policy: OffloadPolicy = OffloadPolicy.CHUNK_LEVEL
    max_inflight_chunks: int = 256

    def __post_init__(self) -> None:
        errors = ErrorList()
        with errors.check():
            _check_int(self.capacity_chunks, "capacity_chunks", 1)
        with errors.check():
            _check_eviction_policy(self.eviction_policy)
        with errors.check():
            _check_name(self.name)
        with errors.check():
            _check_locality(self.locality)
        with errors.check():
            policy = _offload_policy(self.offload_policy)
            object.__setattr__(self, "offload_policy", policy)
        with errors.check():
            _check_int(self.max_inflight_chunks, "max_inflight_chunks", 1)
        errors.raise_if_any()

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> MemoryTierConfig:
        return _from_mapping(cls, "memory", mapping)
