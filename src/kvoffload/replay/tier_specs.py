"""The secondary tiers a replay models, as written on the command line.

`KIND:CAPACITY[:GBPS][:back]`: `file:50000` is a local disk of 50,000 chunks at
the kind's default bandwidth, `redis:200GiB:2.5` a Redis/Valkey server of 200
GiB at 2.5 GB/s, `file:50000:back` a disk written back (the file tier's `write:
back`: a chunk is written when host memory is about to evict it). A capacity of
plain digits counts chunks; one with a unit (`GiB`, `TB`, ...) counts bytes and
holds as many whole chunks as fit. Each kind has a fixed start-up latency per
transfer (a disk read, a network round trip).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, cast

from kvoffload.config.sizes import parse_size

TierKind = Literal["file", "redis"]


@dataclass(frozen=True)
class TierKindDefaults:
    """What a kind of tier is when the spec says no more: its bandwidth, the
    latency of one transfer (and of a Redis existence check), its medium."""

    gbps: float
    latency_s: float
    medium: Literal["cpu", "storage"]
    locality: Literal["local", "remote"]
    described: str


TIER_KINDS: dict[str, TierKindDefaults] = {
    "file": TierKindDefaults(5.0, 1e-4, "storage", "local", "a PCIe 4 NVMe SSD"),
    "redis": TierKindDefaults(
        2.5, 5e-4, "cpu", "remote", "one Redis/Valkey server on 25 Gb/s Ethernet"
    ),
}
MAX_GBPS = 1e6
"""1 PB/s: a bandwidth beyond it is a typo (and in bytes per second, past a float)."""
MAX_DIGITS = 18
"""A capacity in chunks has at most this many digits (10^18 chunks: no tier)."""
_ALLOWED = (
    "KIND:CAPACITY[:GBPS][:back] with KIND file or redis, e.g. 'file:50000', "
    "'redis:200GiB:2.5' or 'file:50000:back' (a file tier written back)"
)


@dataclass(frozen=True)
class TierSpec:
    """One modeled secondary tier: its kind, its capacity (chunks, or bytes with
    `capacity_in_bytes`) and its bandwidth in GB/s (10^9 bytes per second)."""

    kind: TierKind
    capacity: int
    capacity_in_bytes: bool
    gbps: float
    text: str = ""
    write_back: bool = False
    """Written when host memory is about to evict a chunk (`file` only)."""

    @property
    def defaults(self) -> TierKindDefaults:
        return TIER_KINDS[self.kind]

    @property
    def bytes_per_s(self) -> float:
        return self.gbps * 1e9

    def capacity_chunks(self, chunk_bytes: int) -> int:
        """Chunks of `chunk_bytes` the tier holds; at least one, or ValueError."""
        if not self.capacity_in_bytes:
            return self.capacity
        chunks = self.capacity // chunk_bytes
        if chunks < 1:
            raise ValueError(
                f"tier {self.text!r}: {self.capacity} bytes cannot hold one chunk of "
                f"{chunk_bytes} bytes; give a larger capacity"
            )
        return chunks


def parse_tier_spec(text: str) -> TierSpec:
    """A `TierSpec` from `KIND:CAPACITY[:GBPS][:back]`; ValueError naming what is
    wrong."""
    parts = text.split(":")
    write_back = len(parts) > 2 and parts[-1] == "back"
    if write_back:
        parts.pop()
    if len(parts) not in (2, 3):
        raise ValueError(f"{text!r} is not {_ALLOWED}")
    kind = parts[0]
    if kind not in TIER_KINDS:
        raise ValueError(
            f"{text!r}: {kind!r} is not a tier kind; expected one of "
            f"{', '.join(TIER_KINDS)} ({_ALLOWED})"
        )
    capacity, in_bytes = _capacity(text, parts[1])
    if write_back and kind != "file":
        raise ValueError(
            f"{text!r}: only a file tier can be written back (':back'); "
            f"{kind!r} is written through"
        )
    gbps = TIER_KINDS[kind].gbps if len(parts) == 2 else _gbps(text, parts[2])
    return TierSpec(cast(TierKind, kind), capacity, in_bytes, gbps, text, write_back)


def check_shareable(spec: TierSpec) -> None:
    """A tier every engine of a fleet shares is written through; ValueError
    for one written back."""
    if spec.write_back:
        raise ValueError(
            f"{spec.text!r}: a tier the engines share is written through (the "
            "others would find a chunk only once one engine's host memory "
            "evicts it); drop ':back'"
        )


def _capacity(text: str, field: str) -> tuple[int, bool]:
    allowed = "a whole number of chunks >= 1 or a size with a unit such as '200GiB'"
    digits = field.strip()
    if digits.isascii() and digits.isdigit():
        value = int(digits) if len(digits) <= MAX_DIGITS else 0
        if value < 1:
            raise ValueError(f"{text!r}: capacity {field!r} is not {allowed}")
        return value, False
    try:
        size = parse_size(field, "capacity")
    except ValueError:
        raise ValueError(f"{text!r}: capacity {field!r} is not {allowed}") from None
    if size < 1:
        raise ValueError(f"{text!r}: capacity {field!r} is not {allowed}")
    return size, True


def _gbps(text: str, field: str) -> float:
    allowed = f"a finite number of GB/s > 0 and <= {MAX_GBPS:g}"
    try:
        value = float(field)
    except ValueError:
        raise ValueError(f"{text!r}: bandwidth {field!r} is not {allowed}") from None
    if not math.isfinite(value) or not 0 < value <= MAX_GBPS:
        raise ValueError(f"{text!r}: bandwidth {field!r} is not {allowed}")
    return value
