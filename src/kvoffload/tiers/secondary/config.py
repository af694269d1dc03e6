"""Frozen, validated configurations of the secondary tiers, built once at the edge.

`from_mapping` takes the dict a user writes in `secondary_tiers`, for example
`{"type": "file", "path": "/nvme/kv", "capacity": "500GiB"}` or
`{"type": "redis", "url": "redis://cache:6379/0"}`; an unknown key is an error
that lists the valid ones.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any, TypeVar

from kvoffload.config import config_mapping, finite_seconds, is_count, parse_size, shown
from kvoffload.config.errors import ErrorList, unknown_key
from kvoffload.config.request_params import LOCALITIES, MEDIA
from kvoffload.policies import get_policy_class
from kvoffload.tiers.base import OffloadPolicy
from kvoffload.tiers.secondary.base import Locality
from kvoffload.tiers.secondary.file_access import FILE_MODES, PRIVATE_FILE_MODE

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


def check_placement(config: Any, errors: ErrorList) -> None:
    """The fields every tier's config has, each checked on its own into
    `errors`: `name`, `locality` and `offload_policy` (made an `OffloadPolicy`)."""
    with errors.check():
        _check_name(config.name)
    with errors.check():
        _check_locality(config.locality)
    with errors.check():
        policy = _offload_policy(config.offload_policy)
        object.__setattr__(config, "offload_policy", policy)


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


WRITE_MODES = ("through", "back")


def _check_write(value: object) -> None:
    if value not in WRITE_MODES:
        raise ValueError(
            f"write: {shown(value)} must be 'through' (every chunk host memory "
            "stores is written) or 'back' (a chunk is written when host memory "
            "is about to evict it: the tier holds what host memory does not)"
        )


def _check_write_back_alone(
    write: str, offload_policy: OffloadPolicy, shared: bool
) -> None:
    """Write-back suits a tier that serves this engine alone, chunk by chunk."""
    if write != "back":
        return
    if offload_policy is OffloadPolicy.REQUEST_LEVEL:
        raise ValueError(
            "write: 'back' cannot be combined with offload_policy "
            "'request_level', which writes a request's whole context when it "
            "is stored"
        )
    if shared:
        raise ValueError(
            "write: 'back' cannot be combined with rescan_interval_s > 0 (a "
            "directory shared by engines): others would find a chunk only once "
            "this engine's host memory evicts it"
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
    write: str = "through"
    """`through`: every chunk host memory stores is written (a restart finds
    them all); `back`: a chunk is written when host memory is about to evict
    it, so the tier holds what host memory does not (docs/fleet.md)."""

    def __post_init__(self) -> None:
        # Each check on its own: every bad setting is reported at once.
        errors = ErrorList()
        with errors.check():
            _check_path(self.path)
        with errors.check():
            object.__setattr__(self, "capacity_bytes", _capacity(self.capacity_bytes))
        with errors.check():
            _check_eviction_policy(self.eviction_policy)
        check_placement(self, errors)
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
        with errors.check():
            _check_write(self.write)
        errors.raise_if_any()
        # Checked once every field is known good.
        _check_write_back_alone(
            self.write, self.offload_policy, bool(self.rescan_interval_s)
        )

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> FileTierConfig:
        return _from_mapping(cls, "file", mapping)


@dataclass(frozen=True)
class MemoryTierConfig:
    """An in-process dict of chunks: the reference tier for tests and simulation."""

    capacity_chunks: int
    eviction_policy: str = "lru"
    name: str = "memory"
    locality: Locality = "local"
    offload_policy: OffloadPolicy = OffloadPolicy.CHUNK_LEVEL
    max_inflight_chunks: int = 256
    write: str = "through"
    """As the file tier's `write`."""

    def __post_init__(self) -> None:
        errors = ErrorList()
        with errors.check():
            _check_int(self.capacity_chunks, "capacity_chunks", 1)
        with errors.check():
            _check_eviction_policy(self.eviction_policy)
        check_placement(self, errors)
        with errors.check():
            _check_int(self.max_inflight_chunks, "max_inflight_chunks", 1)
        with errors.check():
            _check_write(self.write)
        errors.raise_if_any()
        _check_write_back_alone(self.write, self.offload_policy, False)

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> MemoryTierConfig:
        return _from_mapping(cls, "memory", mapping)
