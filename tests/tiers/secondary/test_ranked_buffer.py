"""Secondary tiers over the pools of several tensor-parallel ranks.

Each rank's pool holds that rank's slice of a chunk at the same slot; a tier
stores the slices as one chunk and, on a load, gives every rank back its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvoffload import LookupResult
from kvoffload.tiers.secondary import ArrayChunkBuffer, RankedChunkBuffer
from kvoffload.tiers.secondary.buffer import scatter
from tests.tiers.secondary.secondary_support import (
    GROUPS,
    SLOT,
    Jobs,
    TierFactory,
    key,
    payload,
    resolve,
)

RANKS = 2


@pytest.fixture
def ranks() -> list[ArrayChunkBuffer]:
    return [ArrayChunkBuffer(16, SLOT, GROUPS) for _ in range(RANKS)]


@pytest.fixture
def buffer(ranks: list[ArrayChunkBuffer]) -> RankedChunkBuffer:
    """Overrides conftest's: `make_tier` builds its tiers on all ranks' pools."""
    return RankedChunkBuffer(ranks)


def fill(
    ranks: list[ArrayChunkBuffer], slot: int, k: bytes, group: int = 0
) -> list[bytes]:
    """A different slice of chunk `k` in every rank's slot."""
    parts = [payload(k + bytes([r]), GROUPS[group]) for r in range(len(ranks))]  # type: ignore[arg-type]
    for rank, part in zip(ranks, parts, strict=True):
        rank.slot_view(slot)[: len(part)] = part
    return parts


def held(ranks: list[ArrayChunkBuffer], slot: int, n: int) -> list[bytes]:
    return [bytes(rank.slot_view(slot)[:n]) for rank in ranks]


def test_a_chunk_is_every_ranks_slice_in_rank_order(
    ranks: list[ArrayChunkBuffer], buffer: RankedChunkBuffer
) -> None:
    assert buffer.num_slots == 16
    assert buffer.slot_nbytes == RANKS * SLOT
    assert [buffer.chunk_nbytes(g) for g in (0, 1)] == [RANKS * n for n in GROUPS]
    parts = fill(ranks, 3, key(1), group=1)
    views = buffer.chunk_views(3, 1)
    assert [bytes(v) for v in views] == parts
    scatter(b"".join(reversed(parts)), views)  # views write through to each pool
    assert held(ranks, 3, GROUPS[1]) == parts[::-1]


def test_ranks_must_agree_on_their_slots() -> None:
    with pytest.raises(ValueError, match="at least one"):
        RankedChunkBuffer([])
    with pytest.raises(ValueError, match="slot count"):
        RankedChunkBuffer([ArrayChunkBuffer(16, SLOT), ArrayChunkBuffer(8, SLOT)])


def test_scatter_refuses_a_payload_of_the_wrong_size(buffer: RankedChunkBuffer) -> None:
    with pytest.raises(ValueError, match="scatter"):
        scatter(b"x" * (buffer.chunk_nbytes(0) - 1), buffer.chunk_views(0, 0))


@pytest.mark.parametrize("group", [0, 1])
def test_every_rank_gets_its_own_slice_back(
    make_tier: TierFactory, ranks: list[ArrayChunkBuffer], group: int
) -> None:
    tier = make_tier()
    jobs = Jobs(tier)
    k = key(7, group=group)
    parts = fill(ranks, 0, k, group)
    stored = jobs.store([k], [0])
    assert stored.success and stored.num_bytes == RANKS * GROUPS[group]
    assert resolve(tier, k) is LookupResult.HIT
    for rank in ranks:
        rank.slot_view(9)[:] = b"\xaa" * SLOT
    loaded = jobs.load([k], [9])
    assert loaded.success and loaded.num_bytes == RANKS * GROUPS[group]
    assert held(ranks, 9, GROUPS[group]) == parts
    # A group-1 chunk is shorter than the slot: the rest of each slot is left alone.
    assert held(ranks, 9, SLOT) == [p + b"\xaa" * (SLOT - len(p)) for p in parts]


def test_a_damaged_slice_in_a_file_is_a_miss_not_wrong_data(
    tmp_path: Path, ranks: list[ArrayChunkBuffer], buffer: RankedChunkBuffer
) -> None:
    from kvoffload.tiers.secondary import create_secondary_tier
    from tests.tiers.secondary.secondary_support import FINGERPRINT

    tier = create_secondary_tier(
        {"type": "file", "path": str(tmp_path / "t"), "capacity": "1MiB"},
        buffer,
        FINGERPRINT,
    )
    try:
        jobs = Jobs(tier)
        k = key(8)
        fill(ranks, 0, k)
        assert jobs.store([k], [0]).success
        (path,) = (tmp_path / "t").rglob("*.kvc")
        data = bytearray(path.read_bytes())
        data[-SLOT // 2] ^= 0xFF  # inside the last rank's slice
        path.write_bytes(bytes(data))
        result = jobs.load([k], [5])
        assert not result.success and result.failed_keys == (k,)
        assert resolve(tier, k) is LookupResult.MISS
    finally:
        tier.shutdown()
