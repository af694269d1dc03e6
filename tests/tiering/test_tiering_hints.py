"""Retention hints travel with chunks: cascaded to the file and Redis tiers,
honoured there, and handed back to host memory by a promotion; chunks written in
the format before hints still load."""

from __future__ import annotations

import os
import struct
import time
import zlib
from pathlib import Path

import pytest
import redis

from kvoffload import CPUOffloadingManager, LookupResult, OffloadKey, ReqContext
from kvoffload.tiering import TieringManager
from kvoffload.tiers.secondary import (
    ArrayChunkBuffer,
    FileTier,
    FileTierConfig,
    RedisTierConfig,
    codec,
    create_secondary_tier,
)
from kvoffload.tiers.secondary.file_io import payload_offset
from kvoffload.tiers.secondary.redis_server import RedisServer
from kvoffload.tiers.secondary.redis_tier import RedisTier
from tests.tiering.tiering_support import (
    FINGERPRINT,
    SLOT,
    Clock,
    Engine,
    key,
    keys,
    payload,
    wait_until,
)

FILE = payload_offset(36, FINGERPRINT) + SLOT
"""Bytes of one chunk file."""


def hinted(req_id: str, seconds: float | None) -> ReqContext:
    params = None if seconds is None else {"kv_retention_s": seconds}
    return ReqContext.create(req_id, params)


def file_stack(
    path: Path,
    capacity: int,
    num_chunks: int = 8,
    clock: Clock | None = None,
    rescan_interval_s: float = 0,
) -> tuple[TieringManager, Engine, FileTier]:
    clock = clock or Clock()
    buf = ArrayChunkBuffer(num_chunks, SLOT)
    tier = FileTier(
        FileTierConfig(str(path), capacity, rescan_interval_s=rescan_interval_s),
        buf,
        FINGERPRINT,
        clock,
        max_hinted_share=1.0,
    )
    primary = CPUOffloadingManager(num_chunks, max_hinted_share=1.0, clock=clock)
    manager = TieringManager(primary, [tier], clock=clock)
    return manager, Engine(manager, buf), tier


def v1_chunk(k: OffloadKey, data: bytes, fingerprint: str) -> bytes:
    """A header as format 1 wrote it (before retention hints)."""
    fp = fingerprint.encode()
    crc = codec.payload_checksum([data])
    head = struct.pack("<4sHHHHQI", b"KVOC", 1, 0, len(k), len(fp), len(data), crc)
    head += k + fp
    return head + struct.pack("<I", zlib.crc32(head))


def promote(manager: TieringManager, engine: Engine, k: OffloadKey) -> None:
    reader = ReqContext("reader")
    manager.on_new_request(reader)
    assert engine.lookup_until_known(k, reader) is LookupResult.HIT
    engine.load([k], reader)


def test_a_hint_cascades_to_the_file_tier_and_comes_back_with_a_promotion(
    tmp_path: Path,
) -> None:
    """Scenario: a request held for 60 s stores two chunks; the file tier holds
    them under the hint and writes it in their headers; after a restart, a
    promotion hands the hint back to host memory."""
    m, engine, tier = file_stack(tmp_path, 8 * FILE)
    writer = hinted("w", 60)
    m.on_new_request(writer)
    engine.store(keys(1, 2), writer)
    engine.settle()
    assert m.get_stats()["file"].hinted_chunks == 2
    with open(tier.chunk_path(key(1)), "rb") as f:
        left = codec.decode_header(f.read(4096)).hint_left(time.time())
    assert left is not None and 55 < left <= 60
    m.shutdown()

    again, engine2, _ = file_stack(tmp_path, 8 * FILE)  # a restart
    promote(again, engine2, key(1))
    hint = again.primary.hints_of(keys(1))
    assert hint is not None and hint[0] is not None and 55 < hint[0] <= 60
    assert again.get_stats()["file"].chunks_loaded == 1
    again.shutdown()


def files_of(tier: FileTier, ids: range) -> list[int]:
    """Those of `ids` whose chunk file is on disk."""
    return [i for i in ids if os.path.exists(tier.chunk_path(key(i)))]


def test_the_file_tier_evicts_chunks_hinted_0_first(tmp_path: Path) -> None:
    """Scenario: a file tier of 4 chunk files holds two unhinted chunks, then
    two of a last turn (hint 0); the next two stores take the last turn's."""
    m, engine, tier = file_stack(tmp_path, 4 * FILE)
    for ids, ctx in (([1, 2], hinted("a", None)), ([3, 4], hinted("last", 0))):
        m.on_new_request(ctx)
        engine.store(keys(*ids), ctx)
        engine.settle()
    later = hinted("b", None)
    m.on_new_request(later)
    engine.store(keys(5, 6), later)
    engine.settle()
    assert files_of(tier, range(1, 7)) == [1, 2, 5, 6]
    m.shutdown()


def test_a_touch_hinted_0_leaves_the_file_tiers_order_alone(tmp_path: Path) -> None:
    """Scenario: chunks 1-2, then 3-4, stored unhinted; a request hinted 0
    touches 3-4 in the file tier (say a system prompt other conversations share:
    host memory cuts a 0 at the last branch point, and only the cascade carries
    that cut). The next two stores evict 1-2, the oldest, as without the 0."""
    m, engine, tier = file_stack(tmp_path, 4 * FILE)
    for ids, name in (([1, 2], "a"), ([3, 4], "b")):
        ctx = hinted(name, None)
        m.on_new_request(ctx)
        engine.store(keys(*ids), ctx)
        engine.settle()
    tier.touch(keys(3, 4), hinted("last", 0))
    later = hinted("c", None)
    m.on_new_request(later)
    engine.store(keys(5, 6), later)
    engine.settle()
    assert files_of(tier, range(1, 7)) == [3, 4, 5, 6]
    m.shutdown()


def test_a_chunk_file_of_the_format_before_hints_still_loads(tmp_path: Path) -> None:
    m, _, tier = file_stack(tmp_path, 8 * FILE)
    path = tier.chunk_path(key(7))
    m.shutdown()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = payload(key(7), SLOT)
    head = v1_chunk(key(7), data, FINGERPRINT)
    with open(path, "wb") as f:
        f.write(head + bytes(payload_offset(36, FINGERPRINT) - len(head)) + data)
    restarted, engine, _ = file_stack(tmp_path, 8 * FILE)
    promote(restarted, engine, key(7))  # Engine.load checks the bytes
    assert restarted.primary.hints_of(keys(7)) in (None, (None,))
    restarted.shutdown()


def redis_stack(
    url: str, ttl_s: float | None = None
) -> tuple[TieringManager, Engine, RedisTier]:
    clock = Clock()
    buf = ArrayChunkBuffer(8, SLOT)
    tier = RedisTier(RedisTierConfig(url, ttl_s=ttl_s), buf, "fp-redis", clock)
    primary = CPUOffloadingManager(8, max_hinted_share=1.0, clock=clock)
    manager = TieringManager(primary, [tier], clock=clock)
    return manager, Engine(manager, buf), tier


def test_a_redis_value_holds_its_hint_and_outlives_ttl_s_while_held(
    redis_server: RedisServer,
) -> None:
    """Scenario: with `ttl_s` 30, a chunk held for 600 s gets a 600 s expiry
    and its hint in the value; another engine loading it takes the hint. A
    chunk hinted 0 is not sent at all."""
    a, engine_a, tier = redis_stack(redis_server.url, ttl_s=30)
    held, done = hinted("held", 600), hinted("done", 0)
    for ctx, ids in ((held, [1]), (done, [2])):
        a.on_new_request(ctx)
        engine_a.store(keys(*ids), ctx)
    engine_a.settle()
    client = redis.Redis.from_url(redis_server.url)
    assert client.pttl(tier.redis_key(key(1))) > 590_000
    assert client.exists(tier.redis_key(key(2))) == 0
    assert a.get_stats()["redis"].store_skipped == 1
    b, engine_b, _ = redis_stack(redis_server.url, ttl_s=30)
    promote(b, engine_b, key(1))
    hint = b.primary.hints_of(keys(1))
    assert hint is not None and hint[0] is not None and 590 < hint[0] <= 600
    assert b.get_stats()["redis"].hints_honoured == 1  # a hinted chunk hit
    a.shutdown()
    b.shutdown()


def test_a_cascade_without_a_hint_never_shortens_a_held_values_expiry(
    redis_server: RedisServer,
) -> None:
    """Scenario: engine A stores a chunk held for 600 s (`ttl_s` 30); engine B,
    whose request sends no hint, stores the same chunk: the value is not sent
    again and keeps its 600 s expiry (renewing it to `ttl_s` would have let it
    go in 30 s, against its hint). A value near its end is renewed to `ttl_s`."""
    a, engine_a, tier = redis_stack(redis_server.url, ttl_s=30)
    held = hinted("held", 600)
    a.on_new_request(held)
    engine_a.store(keys(1), held)
    engine_a.settle()
    client = redis.Redis.from_url(redis_server.url)
    name = tier.redis_key(key(1))
    b, engine_b, _ = redis_stack(redis_server.url, ttl_s=30)
    plain = ReqContext("plain")
    b.on_new_request(plain)
    engine_b.store(keys(1), plain)
    engine_b.settle()
    assert b.get_stats()["redis"].chunks_stored == 0  # held: not sent again
    assert client.pttl(name) > 590_000
    client.pexpire(name, 2_000)
    b.on_new_request(again := ReqContext("again"))
    b.primary.reset_cache()
    engine_b.store(keys(1), again)
    engine_b.settle()
    assert 20_000 < client.pttl(name) <= 30_000  # type: ignore[operator]
    a.shutdown()
    b.shutdown()


def test_a_redis_value_of_the_format_before_hints_still_loads(
    redis_server: RedisServer,
) -> None:
    m, engine, tier = redis_stack(redis_server.url)
    data = payload(key(3), SLOT)
    client = redis.Redis.from_url(redis_server.url)
    client.set(tier.redis_key(key(3)), v1_chunk(key(3), data, "fp-redis") + data)
    promote(m, engine, key(3))  # Engine.load checks the bytes
    assert m.primary.hints_of(keys(3)) is None
    m.shutdown()


@pytest.mark.parametrize("seconds", [30.0, 0.0])
def test_a_cascade_carries_the_hint_the_primary_tier_holds_now(
    tmp_path: Path, seconds: float
) -> None:
    """Scenario: a chunk held for 30 s (or hinted 0) is cascaded: the file's
    header holds that hint, and the file tier counts a held chunk for 30 s."""
    m, engine, tier = file_stack(tmp_path, 8 * FILE)
    ctx = hinted("w", seconds)
    m.on_new_request(ctx)
    engine.store(keys(1), ctx)
    engine.settle()
    with open(tier.chunk_path(key(1)), "rb") as f:
        left = codec.decode_header(f.read(4096)).hint_left(time.time())
    assert left == pytest.approx(seconds, abs=5)
    assert m.get_stats()["file"].hinted_chunks == (1 if seconds else 0)
    m.shutdown()


@pytest.mark.parametrize("seconds", [1e300, 1e12])
def test_a_redis_value_under_a_hint_of_ages_is_stored_with_a_bounded_expiry(
    redis_server: RedisServer, seconds: float
) -> None:
    """Scenario: with `ttl_s` set, a request claims a hint longer than any
    expiry the server accepts (a finite number, so a valid hint): the value is
    stored, living as long as the server allows, not failed."""
    m, engine, tier = redis_stack(redis_server.url, ttl_s=30)
    ctx = hinted("ages", seconds)
    m.on_new_request(ctx)
    engine.store(keys(1), ctx)
    engine.settle()
    client = redis.Redis.from_url(redis_server.url)
    assert client.pttl(tier.redis_key(key(1))) > 30_000
    stats = m.get_stats()["redis"]
    assert (stats.chunks_stored, stats.failures) == (1, 0)
    m.shutdown()


def test_a_returning_request_renews_its_prefixs_hint_in_the_file_tier(
    tmp_path: Path,
) -> None:
    """Scenario: a turn held for 60 s cascades two chunks to the file tier; 50 s
    later the next turn, held for 60 s too, hits that prefix (a touch): 20 s
    after it the file tier still holds both under a hint, none expired."""
    clock = Clock()
    m, engine, _ = file_stack(tmp_path, 8 * FILE, clock=clock)
    first = hinted("turn1", 60)
    m.on_new_request(first)
    engine.store(keys(1, 2), first)
    engine.settle()
    clock.advance(50)
    second = hinted("turn2", 60)
    m.on_new_request(second)
    m.touch(keys(1, 2), second)
    clock.advance(20)
    stats = m.get_stats()["file"]
    assert (stats.hinted_chunks, stats.hints_expired_unused) == (2, 0)
    m.shutdown()


def hinted_chunks(m: TieringManager, engine: Engine, n: int) -> None:
    """Step until the file tier holds `n` chunks under a hint (its headers are
    read on its rescan thread)."""
    wait_until(lambda: m.get_stats()["file"].hinted_chunks == n, engine.step)


def test_a_restarted_file_tier_takes_the_hints_its_files_hold(
    tmp_path: Path,
) -> None:
    """Scenario: a file tier of 4 chunk files holds two chunks held for 60 s,
    one hinted 0 and one unhinted, the held ones written first (the oldest
    files); after a restart, storing two more chunks evicts the one hinted 0
    and the unhinted one, not the held ones."""
    m, engine, _ = file_stack(tmp_path, 4 * FILE)
    for ids, ctx in (
        ([1, 2], hinted("held", 60)),
        ([3], hinted("last", 0)),
        ([4], hinted("plain", None)),
    ):
        m.on_new_request(ctx)
        engine.store(keys(*ids), ctx)
        engine.settle()
    m.shutdown()

    again, engine2, tier = file_stack(tmp_path, 4 * FILE)
    hinted_chunks(again, engine2, 2)
    later = hinted("later", None)
    again.on_new_request(later)
    engine2.store(keys(5, 6), later)
    engine2.settle()
    files = [os.path.exists(tier.chunk_path(k)) for k in keys(1, 2, 3, 4, 5, 6)]
    assert files == [True, True, False, False, True, True]
    again.shutdown()


def test_a_restart_takes_no_hint_from_an_expired_or_unreadable_header(
    tmp_path: Path,
) -> None:
    """Scenario: of three files held for 60 s, one's hint ended before the
    restart, another's header is garbage: after the restart only the third is
    held, and the garbled one is a miss when loaded, never a crash."""
    m, engine, tier = file_stack(tmp_path, 8 * FILE)
    ctx = hinted("short", 60)
    m.on_new_request(ctx)
    engine.store(keys(1, 2, 3), ctx)
    engine.settle()
    m.shutdown()
    with open(tier.chunk_path(key(1)), "r+b") as f:
        head = bytearray(f.read(4096))
        struct.pack_into("<d", head, 24, time.time() - 1)  # the deadline
        end = 32 + 36 + len(FINGERPRINT)
        struct.pack_into("<I", head, end, zlib.crc32(head[:end]))
        f.seek(0)
        f.write(head)
    with open(tier.chunk_path(key(2)), "r+b") as f:
        f.write(b"garbage")
    again, engine2, _ = file_stack(tmp_path, 8 * FILE)
    hinted_chunks(again, engine2, 1)  # the three headers were read in one call
    reader = hinted("reader", None)
    again.on_new_request(reader)
    assert engine2.lookup_until_known(key(2), reader) is LookupResult.MISS
    promote(again, engine2, key(1))
    assert again.get_stats()["file"].hinted_chunks == 1
    again.shutdown()


def test_a_file_another_engine_wrote_brings_its_hint_into_this_tier(
    tmp_path: Path,
) -> None:
    """Scenario: engines A and B share a directory; B rescans it. A stores two
    chunks held for 60 s: once B finds them, it holds them under the hint."""
    a, engine_a, _ = file_stack(tmp_path, 8 * FILE)
    clock = Clock()
    b, engine_b, _ = file_stack(tmp_path, 8 * FILE, clock=clock, rescan_interval_s=1.0)
    ctx = hinted("w", 60)
    a.on_new_request(ctx)
    engine_a.store(keys(1, 2), ctx)
    engine_a.settle()

    def step() -> None:
        clock.advance(1.0)
        engine_b.step()

    wait_until(lambda: b.get_stats()["file"].hinted_chunks == 2, step)
    assert b.get_stats()["file"].occupancy == 2
    a.shutdown()
    b.shutdown()


def test_without_ttl_s_a_held_redis_value_gets_no_expiry(
    redis_server: RedisServer,
) -> None:
    """An expiry would make the value volatile, the first to go under the
    server's `volatile-*` policies: without `ttl_s`, hinted values never expire."""
    m, engine, tier = redis_stack(redis_server.url)
    ctx = hinted("held", 600)
    m.on_new_request(ctx)
    engine.store(keys(1), ctx)
    engine.settle()
    assert redis.Redis.from_url(redis_server.url).pttl(tier.redis_key(key(1))) == -1
    m.shutdown()


def test_the_memory_tier_honours_hints_and_hands_them_back(tmp_path: Path) -> None:
    """Scenario: a memory tier of 4 chunks holds two chunks held for 60 s, then
    two unhinted ones; two more stores evict the unhinted ones, and a promotion
    of a held chunk hands its hint back to host memory."""
    clock = Clock()
    buf = ArrayChunkBuffer(8, SLOT)
    tier = create_secondary_tier(
        {"type": "memory", "capacity_chunks": 4}, buf, FINGERPRINT, clock, 0.5
    )
    primary = CPUOffloadingManager(8, max_hinted_share=1.0, clock=clock)
    m = TieringManager(primary, [tier], clock=clock)
    engine = Engine(m, buf)
    for ids, ctx in (
        ([1, 2], hinted("held", 60)),
        ([3, 4], hinted("a", None)),
        ([5, 6], hinted("b", None)),
    ):
        m.on_new_request(ctx)
        engine.store(keys(*ids), ctx)
        engine.settle()
    assert [tier.lookup(k, hinted("r", None)) for k in keys(1, 2, 3, 4)] == [
        LookupResult.HIT,
        LookupResult.HIT,
        LookupResult.MISS,
        LookupResult.MISS,
    ]
    assert m.get_stats()["memory"].hinted_chunks == 2
    clock.advance(10)
    fresh = CPUOffloadingManager(8, clock=clock)
    again = TieringManager(fresh, [tier], clock=clock)
    promote(again, Engine(again, buf), key(1))
    hint = again.primary.hints_of(keys(1))
    assert hint is not None and hint[0] == pytest.approx(50)
    assert again.get_stats()["memory"].hints_honoured == 1


def test_a_hint_the_file_tier_held_to_its_end_unused_counts_as_expired(
    tmp_path: Path,
) -> None:
    """Scenario: two chunks held for 60 s are never loaded; 61 s later the file
    tier holds them unhinted and counts two hints expired unused, none
    honoured."""
    clock = Clock()
    m, engine, _ = file_stack(tmp_path, 8 * FILE, clock=clock)
    ctx = hinted("w", 60)
    m.on_new_request(ctx)
    engine.store(keys(1, 2), ctx)
    engine.settle()
    clock.advance(61)
    stats = m.get_stats()["file"]
    assert (stats.hinted_chunks, stats.hints_expired_unused) == (0, 2)
    assert (stats.hints_honoured, stats.occupancy) == (0, 2)
    m.shutdown()
