"""The SecondaryTier contract, run against every tier (memory, file, redis)."""

from __future__ import annotations

from kvoffload import LookupResult, OffloadPolicy
from kvoffload.tiers.secondary import ArrayChunkBuffer
from tests.tiers.secondary.secondary_support import (
    CTX,
    GROUPS,
    Jobs,
    TierFactory,
    key,
    payload,
    resolve,
    settle,
)


def fill(buffer: ArrayChunkBuffer, slot: int, k: bytes, group: int = 0) -> bytes:
    data = payload(k, GROUPS[group])  # type: ignore[arg-type]
    buffer.slot_view(slot)[: len(data)] = data
    return data


def test_unknown_key_misses(make_tier: TierFactory) -> None:
    tier = make_tier()
    assert resolve(tier, key(1)) is LookupResult.MISS


def test_stored_chunks_hit_and_load_back_identical(
    make_tier: TierFactory, buffer: ArrayChunkBuffer
) -> None:
    tier = make_tier()
    jobs = Jobs(tier)
    ks = [key(1), key(2)]
    data = [fill(buffer, 0, ks[0]), fill(buffer, 1, ks[1])]
    assert jobs.store(ks, [0, 1]).success
    assert [resolve(tier, k) for k in ks] == [LookupResult.HIT] * 2
    result = jobs.load(ks, [5, 6])
    assert result.success and result.num_bytes == sum(map(len, data))
    assert bytes(buffer.slot_view(5)[: len(data[0])]) == data[0]
    assert bytes(buffer.slot_view(6)[: len(data[1])]) == data[1]


def test_group_chunk_uses_its_own_size_and_leaves_the_rest_of_the_slot(
    make_tier: TierFactory, buffer: ArrayChunkBuffer
) -> None:
    tier = make_tier()
    jobs = Jobs(tier)
    k = key(3, group=1)
    data = fill(buffer, 0, k, group=1)
    assert jobs.store([k], [0]).num_bytes == GROUPS[1]
    buffer.slot_view(7)[:] = b"\xaa" * len(buffer.slot_view(7))
    assert jobs.load([k], [7]).success
    view = buffer.slot_view(7)
    assert bytes(view[: GROUPS[1]]) == data
    assert bytes(view[GROUPS[1] :]) == b"\xaa" * (len(view) - GROUPS[1])


def test_storing_a_present_chunk_is_skipped_not_failed(
    make_tier: TierFactory, buffer: ArrayChunkBuffer
) -> None:
    tier = make_tier()
    jobs = Jobs(tier)
    fill(buffer, 0, key(1))
    assert jobs.store([key(1)], [0]).success
    assert resolve(tier, key(1)) is LookupResult.HIT
    assert jobs.store([key(1)], [0]).success
    assert tier.get_stats().chunks_stored == 1


def test_loading_an_absent_chunk_reports_it_failed(make_tier: TierFactory) -> None:
    tier = make_tier()
    result = Jobs(tier).load([key(42)], [3])
    assert not result.success and result.failed_keys == (key(42),)


def test_every_job_has_one_result_and_drain_waits_for_all(
    make_tier: TierFactory, buffer: ArrayChunkBuffer
) -> None:
    from kvoffload.tiers.secondary import TierJob

    tier = make_tier()
    for slot in range(8):
        fill(buffer, slot, key(100 + slot))
    for job_id in range(8):
        tier.submit_store(TierJob(job_id, (key(100 + job_id),), (job_id,), CTX))
    tier.drain()
    ids = sorted(r.job_id for r in tier.get_finished_jobs())
    assert ids == list(range(8))
    assert tier.get_finished_jobs() == []
    assert not tier.has_pending_work()


def test_stats_and_events_follow_the_jobs(
    make_tier: TierFactory, buffer: ArrayChunkBuffer
) -> None:
    tier = make_tier()
    jobs = Jobs(tier)
    fill(buffer, 0, key(1))
    jobs.store([key(1)], [0])
    resolve(tier, key(1))
    jobs.load([key(1)], [1])
    stats = tier.get_stats()
    assert stats == tier.get_stats()  # no side effects
    assert (stats.chunks_stored, stats.bytes_stored) == (1, GROUPS[0])
    assert (stats.chunks_loaded, stats.bytes_loaded) == (1, GROUPS[0])
    assert stats.hits >= 1 and stats.lookups >= stats.hits
    stored = [e for e in tier.take_events() if not e.removed]
    assert [e.keys for e in stored] == [(key(1),)]
    assert all(e.tier == tier.name for e in stored)
    assert tier.take_events() == []


def test_on_new_request_returns_the_configured_policy(make_tier: TierFactory) -> None:
    assert make_tier().on_new_request(CTX).policy is OffloadPolicy.CHUNK_LEVEL
    whole = make_tier(name="whole", offload_policy="request_level")
    assert whole.on_new_request(CTX).policy is OffloadPolicy.REQUEST_LEVEL
    whole.on_request_finished(CTX)


def test_identity_attributes(make_tier: TierFactory) -> None:
    tier = make_tier(name="t1")
    assert tier.name == "t1"
    assert tier.medium in ("cpu", "storage")
    assert tier.locality in ("local", "remote")
    assert tier.max_inflight_chunks >= 1


def test_reset_drops_every_chunk_with_removed_events(
    make_tier: TierFactory, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: two chunks stored, then a reset: both miss at once, are
    announced as removed, and cannot be loaded; once the tier has finished
    (drain), a chunk stored after the reset hits and loads as ever."""
    tier = make_tier()
    jobs = Jobs(tier)
    ks = [key(1), key(2, group=1)]
    fill(buffer, 0, ks[0])
    fill(buffer, 1, ks[1], group=1)
    assert jobs.store(ks, [0, 1]).success
    assert [resolve(tier, k) for k in ks] == [LookupResult.HIT] * 2
    tier.take_events()
    tier.reset_cache()
    assert [resolve(tier, k) for k in ks] == [LookupResult.MISS] * 2
    settle(tier)
    removed = {k for e in tier.take_events() if e.removed for k in e.keys}
    assert removed == set(ks)
    assert [resolve(tier, k) for k in ks] == [LookupResult.MISS] * 2
    assert jobs.load(ks, [4, 5]).failed_keys == tuple(ks)
    fill(buffer, 2, key(3))
    assert jobs.store([key(3)], [2]).success
    assert resolve(tier, key(3)) is LookupResult.HIT
    assert jobs.load([key(3)], [6]).success
