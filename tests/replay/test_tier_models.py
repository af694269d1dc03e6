"""The planner's byte-less tiers: specs as written, links in simulated time, and
the file and Redis tiers' own rules over modeled media."""

from __future__ import annotations

import pytest

from kvoffload.engine_model import SimClock
from kvoffload.keys import OffloadKey, make_offload_key
from kvoffload.replay.links import Link
from kvoffload.replay.redis_model import ModeledRedisTier, RedisServerModel
from kvoffload.replay.tier_models import FileBackend, ModeledFileTier
from kvoffload.replay.tier_specs import TIER_KINDS, parse_tier_spec
from kvoffload.tiers.base import LookupResult, ReqContext
from kvoffload.tiers.secondary.base import TierJob

CTX = ReqContext("r")
CHUNK = 1_000_000  # bytes


def key(i: int) -> OffloadKey:
    return make_offload_key(i.to_bytes(8, "big"), 0)


def job(job_id: int, *keys: OffloadKey) -> TierJob:
    return TierJob(job_id, keys, tuple(range(len(keys))), CTX)


# -- specs ----------------------------------------------------------------------


def test_specs_read_kind_capacity_in_chunks_or_bytes_and_bandwidth() -> None:
    spec = parse_tier_spec("file:50000")
    assert (spec.kind, spec.capacity_chunks(CHUNK), spec.gbps) == (
        "file",
        50000,
        TIER_KINDS["file"].gbps,
    )
    spec = parse_tier_spec("redis:2GB:1.5")
    assert (spec.kind, spec.capacity_chunks(CHUNK), spec.bytes_per_s) == (
        "redis",
        2000,
        1.5e9,
    )


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("disk:100", "'disk' is not a tier kind"),
        ("File:100", "is not a tier kind"),
        ("file", "is not KIND:CAPACITY[:GBPS]"),
        ("file:100:1:2", "is not KIND:CAPACITY[:GBPS]"),
        ("file:0", "capacity '0' is not"),
        ("file:-5", "capacity '-5' is not"),
        ("file:1.5", "capacity '1.5' is not"),
        ("file:0GiB", "capacity '0GiB' is not"),
        ("file:lots", "capacity 'lots' is not"),
        ("file:" + "9" * 5000, "is not a whole number of chunks"),
        ("file:100:0", "bandwidth '0' is not a finite number"),
        ("file:100:-1", "bandwidth '-1' is not"),
        ("file:100:nan", "bandwidth 'nan' is not"),
        ("file:100:inf", "bandwidth 'inf' is not"),
        ("redis:100:1e300", "bandwidth '1e300' is not"),
        ("redis:100:fast", "bandwidth 'fast' is not"),
    ],
)
def test_bad_specs_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError) as raised:
        parse_tier_spec(text)
    assert says in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_size_too_small_for_one_chunk_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot hold one chunk"):
        parse_tier_spec("file:1MB").capacity_chunks(2 * CHUNK)


# -- links ----------------------------------------------------------------------


def test_a_link_serves_jobs_in_order_and_measures_its_peak() -> None:
    link = Link(bytes_per_s=1e9, latency_s=0.01)
    assert link.reserve(0.0, 500_000_000) == pytest.approx(0.51)
    # Ready before the first ended: queued behind it.
    assert link.reserve(0.2, 1_000_000_000) == pytest.approx(1.52)
    assert link.reserve(5.0, 0) == pytest.approx(5.01)
    usage = link.usage(span_s=10.0)
    assert usage.num_bytes == 1_500_000_000
    assert usage.mean_bytes_per_s == pytest.approx(1.5e8)
    # Never more than the link carries, whatever the windows cut.
    assert usage.peak_bytes_per_s == pytest.approx(1e9, rel=0.02)


# -- the file tier --------------------------------------------------------------


def file_tier(capacity: int, clock: SimClock, gbps: str = "1") -> ModeledFileTier:
    spec = parse_tier_spec(f"file:{capacity}:{gbps}")
    backend = FileBackend(spec, capacity, CHUNK, "lru")
    return ModeledFileTier("file", backend, clock, record_events=True)


def test_a_file_store_takes_its_bytes_time_and_then_reads_as_a_hit() -> None:
    clock = SimClock()
    tier = file_tier(10, clock)
    tier.submit_store(job(1, key(1), key(2)))
    assert tier.lookup(key(1), CTX) is LookupResult.MISS  # still being written
    due = tier.next_completion()
    latency = TIER_KINDS["file"].latency_s
    assert due == pytest.approx(latency + 2 * CHUNK / 1e9)
    clock.now = due - 1e-9
    assert tier.get_finished_jobs() == []
    clock.now = due
    (result,) = tier.get_finished_jobs()
    assert result.success and result.num_bytes == 2 * CHUNK
    assert tier.lookup(key(1), CTX) is LookupResult.HIT
    assert [e.keys for e in tier.take_events()] == [(key(1), key(2))]


def test_a_full_file_tier_evicts_by_policy_and_never_a_chunk_being_read() -> None:
    clock = SimClock()
    tier = file_tier(2, clock)
    tier.submit_store(job(1, key(1), key(2)))
    clock.now = 1.0
    tier.get_finished_jobs()
    tier.submit_load(job(2, key(1)))  # pins key 1 until the load ends
    tier.submit_store(job(3, key(3)))  # key 2 must go
    clock.now = 2.0
    results = {r.job_id: r for r in tier.get_finished_jobs()}
    assert results[2].success and results[3].success
    assert tier.lookup(key(1), CTX) is LookupResult.HIT
    assert tier.lookup(key(2), CTX) is LookupResult.MISS
    assert tier.get_stats().evictions == 1
    # Both pinned or in flight and the tier full: the store is refused, counted.
    tier.submit_load(job(4, key(1)))
    tier.submit_load(job(5, key(3)))
    tier.submit_store(job(6, key(4)))
    clock.now = 3.0
    results = {r.job_id: r for r in tier.get_finished_jobs()}
    assert results[6].failed_keys == (key(4),)
    assert tier.get_stats().store_skipped == 1


def test_engines_sharing_a_directory_share_its_index_and_its_link() -> None:
    clock_a, clock_b = SimClock(), SimClock()
    spec = parse_tier_spec("file:10:1")
    backend = FileBackend(spec, 10, CHUNK, "lru")
    a = ModeledFileTier("shared-file", backend, clock_a)
    b = ModeledFileTier("shared-file", backend, clock_b)
    a.submit_store(job(1, key(1)))
    b.submit_store(job(1, key(2)))  # queued behind a's write on the same link
    end_a, end_b = a.next_completion(), b.next_completion()
    assert end_a is not None and end_b is not None and end_b > end_a
    clock_a.now = end_a
    a.get_finished_jobs()
    assert b.lookup(key(1), CTX) is LookupResult.HIT  # a's chunk, for b too


# -- the Redis tier -------------------------------------------------------------


def redis_tier(server: RedisServerModel, clock: SimClock) -> ModeledRedisTier:
    return ModeledRedisTier("shared-redis", server, clock, record_events=True)


def test_redis_lookups_answer_a_round_trip_later_and_evictions_are_silent() -> None:
    clock = SimClock()
    server = RedisServerModel(parse_tier_spec("redis:2:1"), 2, CHUNK)
    reader_clock = SimClock()
    writer, reader = redis_tier(server, clock), redis_tier(server, reader_clock)
    writer.submit_store(job(1, key(1), key(2), key(3)))  # one more than fits
    clock.now = 1.0
    assert writer.get_finished_jobs()[0].success
    assert server.evictions == 1 and len(server) == 2
    assert [e.removed for e in writer.take_events()] == [False]  # nothing heard
    reader_clock.now = 1.0
    assert reader.lookup(key(3), CTX) is LookupResult.RETRY
    reader.on_schedule_end()
    assert reader.next_completion() == pytest.approx(
        1.0 + TIER_KINDS["redis"].latency_s
    )
    reader_clock.now = 2.0
    assert reader.get_finished_jobs() == []  # an answer, not a job
    assert reader.lookup(key(3), CTX) is LookupResult.HIT
    assert reader.lookup(key(1), CTX) is LookupResult.RETRY  # never asked


def test_a_redis_load_of_an_evicted_value_fails_and_announces_it_removed() -> None:
    clock = SimClock()
    server = RedisServerModel(parse_tier_spec("redis:1:1"), 1, CHUNK)
    tier = redis_tier(server, clock)
    tier.submit_store(job(1, key(1)))
    clock.now = 1.0
    tier.get_finished_jobs()
    assert tier.lookup(key(1), CTX) is LookupResult.HIT  # believed, after its store
    server.put(key(2))  # another engine's store evicts it
    tier.submit_load(job(2, key(1)))
    clock.now = 2.0
    (result,) = tier.get_finished_jobs()
    assert result.failed_keys == (key(1),)
    assert [(e.keys, e.removed) for e in tier.take_events()][-1] == ((key(1),), True)
    assert tier.lookup(key(1), CTX) is LookupResult.MISS
