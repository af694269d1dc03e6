"""TieringManager cascades: completed stores, request-level tiers, backpressure."""

from __future__ import annotations

from kvoffload import LookupResult, OffloadPolicy, ReqContext
from kvoffload.tiers.secondary import ArrayChunkBuffer, MemoryTier, MemoryTierConfig
from tests.tiering.tiering_support import HeldTier, key, keys, make_manager

R1 = ReqContext("r1")


def test_completed_primary_store_is_cascaded_to_every_tier() -> None:
    """Scenario: a request stores two chunks; both secondary tiers receive them,
    and each tier reports stored events and counts under its name."""
    buf = ArrayChunkBuffer(8, 256)
    a = MemoryTier(MemoryTierConfig(8, name="a"), buf)
    b = MemoryTier(MemoryTierConfig(8, name="b"), buf)
    m, engine = make_manager([a, b], buffer=buf, num_chunks=8, enable_events=True)
    m.on_new_request(R1)
    engine.store(keys(1, 2), R1)
    engine.step()
    stats = m.get_stats()
    assert stats["a"].chunks_stored == 2 and stats["b"].chunks_stored == 2
    events = {(e.tier, e.removed): set(e.keys) for e in m.take_events()}
    assert events[("a", False)] == set(keys(1, 2)) == events[("b", False)]
    assert events[("cpu", False)] == set(keys(1, 2))


def test_chunk_is_pinned_in_primary_while_its_cascade_reads_it() -> None:
    """Scenario: primary full of chunks whose cascades are still running: another
    request's store needing eviction is refused, and succeeds once the cascades
    finished."""
    buf = ArrayChunkBuffer(2, 256)
    tier = HeldTier(buf, auto=False)
    m, engine = make_manager([tier], buffer=buf, num_chunks=2)
    m.on_new_request(R1)
    engine.store(keys(1, 2), R1)
    r2 = ReqContext("r2")
    m.on_new_request(r2)
    assert m.prepare_store(keys(3), r2) is None
    tier.release()
    engine.step()
    out = m.prepare_store(keys(3), r2)
    assert out is not None and out.keys_to_store == (key(3),)


def test_failed_cascade_leaves_chunk_in_primary_and_is_not_retried() -> None:
    """Scenario: the tier fails every store: chunks stay readable in the primary
    tier, the failure is counted by the tier, and no store is submitted again."""
    buf = ArrayChunkBuffer(4, 256)
    tier = HeldTier(buf)
    tier.fail_stores = True
    m, engine = make_manager([tier], buffer=buf, num_chunks=4)
    m.on_new_request(R1)
    engine.store(keys(1), R1)
    for _ in range(3):
        engine.step()
    assert m.lookup(key(1), R1) is LookupResult.HIT
    engine.load(keys(1), R1)
    assert tier.stored_keys() == [key(1)]
    assert m.get_stats()["held"].failures == 1


def test_backpressure_sheds_cascades_beyond_the_in_flight_bound() -> None:
    """Scenario: a slow tier accepts two chunks in flight; three more are shed and
    counted as drops (no queue grows); once it catches up, cascades resume."""
    buf = ArrayChunkBuffer(16, 256)
    slow = HeldTier(buf, name="slow", auto=False, max_inflight_chunks=2)
    m, engine = make_manager([slow], buffer=buf, num_chunks=16)
    m.on_new_request(R1)
    engine.store(keys(1, 2, 3), R1)
    engine.store(keys(4, 5), R1)
    assert slow.stored_keys() == keys(1, 2)
    assert m.get_stats()["slow"].drops == 3
    slow.release()
    engine.step()
    engine.store(keys(6), R1)
    assert slow.stored_keys() == keys(1, 2, 6)
    # Shed chunks were not lost to the engine: they are readable in the primary.
    engine.load(keys(3, 4, 5), R1)


def test_store_tier_filter_restricts_cascades() -> None:
    """Scenario: kv_store_tiers=["remote"] writes to the remote tier only; a
    name selects exactly that tier."""
    buf = ArrayChunkBuffer(8, 256)
    local = HeldTier(buf, name="disk", locality="local")
    remote = HeldTier(buf, name="shared", medium="cpu", locality="remote")
    m, engine = make_manager([local, remote], buffer=buf, num_chunks=8)
    only_remote = ReqContext.create("r", {"kv_store_tiers": ["remote"]})
    only_disk = ReqContext.create("d", {"kv_store_tiers": ["disk"]})
    for ctx in (only_remote, only_disk):
        m.on_new_request(ctx)
    engine.store(keys(1), only_remote)
    engine.store(keys(2), only_disk)
    assert remote.stored_keys() == keys(1)
    assert local.stored_keys() == keys(2)


def test_reuse_filter_still_gates_what_reaches_the_tiers() -> None:
    """Scenario: with store_threshold=2, a chunk looked up by one request is
    neither stored nor cascaded; once a second request looked it up, it is stored
    and cascaded."""
    buf = ArrayChunkBuffer(8, 256)
    tier = HeldTier(buf)
    m, engine = make_manager([tier], buffer=buf, num_chunks=8, store_threshold=2)
    r1, r2 = ReqContext("r1"), ReqContext("r2")
    m.on_new_request(r1)
    assert m.lookup(key(1), r1) is LookupResult.MISS
    assert engine.store(keys(1), r1) == ()
    assert tier.stored_keys() == []
    m.on_new_request(r2)
    assert m.lookup(key(1), r2) is LookupResult.MISS
    assert engine.store(keys(1), r2) == (key(1),)
    assert tier.stored_keys() == keys(1)


def test_request_level_policy_only_when_an_allowed_tier_asks_for_it() -> None:
    """Scenario: one of two tiers is request-level; requests are REQUEST_LEVEL,
    unless their kv_store_tiers exclude that tier."""
    buf = ArrayChunkBuffer(8, 256)
    chunk = HeldTier(buf, name="chunk")
    whole = HeldTier(buf, name="whole", policy=OffloadPolicy.REQUEST_LEVEL)
    m, _ = make_manager([chunk, whole], buffer=buf, num_chunks=8)
    assert m.on_new_request(R1).policy is OffloadPolicy.REQUEST_LEVEL
    excluded = ReqContext.create("x", {"kv_store_tiers": ["chunk"]})
    assert m.on_new_request(excluded).policy is OffloadPolicy.CHUNK_LEVEL
    assert ("new", "x") in whole.calls  # every tier is still asked


def test_request_level_tier_receives_chunks_already_in_primary() -> None:
    """Scenario: r1 stored chunks 1-2 to the chunk-level tier only; r2 (request
    level) hits them and stores chunk 3: the request-level tier gets 1 and 2 at
    once from prepare_store, and 3 when its write completes; the chunk-level
    tier does not get 1 and 2 twice."""
    buf = ArrayChunkBuffer(8, 256)
    chunk = HeldTier(buf, name="chunk")
    whole = HeldTier(buf, name="whole", policy=OffloadPolicy.REQUEST_LEVEL)
    m, engine = make_manager([chunk, whole], buffer=buf, num_chunks=8)
    r1 = ReqContext.create("r1", {"kv_store_tiers": ["chunk"]})
    r2 = ReqContext("r2")
    m.on_new_request(r1)
    engine.store(keys(1, 2), r1)
    assert whole.stored_keys() == []
    m.on_new_request(r2)
    engine.store(keys(1, 2, 3), r2, complete=False)
    assert whole.stored_keys() == keys(1, 2)
    m.complete_store(keys(3), r2)
    assert whole.stored_keys() == keys(1, 2, 3)
    assert chunk.stored_keys() == keys(1, 2, 3)
    assert set(whole.chunks) == set(keys(1, 2, 3))


def test_request_level_cascade_waits_for_chunks_still_being_written() -> None:
    """Scenario: r2 (request level) reaches chunk 1 while r1 is still writing it:
    the chunk is cascaded to the request-level tier when r1's write completes,
    and r2's finish reaches the tiers only after that cascade."""
    buf = ArrayChunkBuffer(8, 256)
    whole = HeldTier(buf, name="whole", policy=OffloadPolicy.REQUEST_LEVEL)
    m, engine = make_manager([whole], buffer=buf, num_chunks=8)
    r1 = ReqContext.create("r1", {"kv_store_tiers": []})
    r2 = ReqContext("r2")
    m.on_new_request(r1)
    m.on_new_request(r2)
    engine.store(keys(1), r1, complete=False)
    out = m.prepare_store(keys(1), r2)
    assert out is not None and out.keys_to_store == ()
    m.on_request_finished(r2)
    assert whole.stored_keys() == [] and ("finished", "r2") not in whole.calls
    m.complete_store(keys(1), r1)
    assert whole.stored_keys() == keys(1)
    assert whole.calls.index(("store", (key(1),))) < whole.calls.index(
        ("finished", "r2")
    )


def test_parked_chunk_whose_write_fails_is_dropped_and_request_finishes() -> None:
    """Scenario: the chunk r2 waits for fails to be written: nothing is cascaded,
    and r2's finish still reaches the tier."""
    buf = ArrayChunkBuffer(8, 256)
    whole = HeldTier(buf, name="whole", policy=OffloadPolicy.REQUEST_LEVEL)
    m, engine = make_manager([whole], buffer=buf, num_chunks=8)
    r1, r2 = ReqContext.create("r1", {"kv_store_tiers": []}), ReqContext("r2")
    m.on_new_request(r1)
    m.on_new_request(r2)
    engine.store(keys(1), r1, complete=False)
    m.prepare_store(keys(1), r2)
    m.on_request_finished(r2)
    m.complete_store(keys(1), r1, success=False)
    assert whole.stored_keys() == []
    assert ("finished", "r2") in whole.calls


def test_finish_is_forwarded_only_after_in_flight_stores_cascaded() -> None:
    """Scenario: a request finishes while its own primary write is in flight: the
    tiers hear of the finish only after that write completed and cascaded."""
    buf = ArrayChunkBuffer(8, 256)
    tier = HeldTier(buf)
    m, engine = make_manager([tier], buffer=buf, num_chunks=8)
    m.on_new_request(R1)
    engine.store(keys(1), R1, complete=False)
    m.on_request_finished(R1)
    assert ("finished", "r1") not in tier.calls
    m.complete_store(keys(1), R1)
    assert tier.calls[-2:] == [("store", (key(1),)), ("finished", "r1")]


def test_finish_of_an_idle_request_is_forwarded_at_once_and_once() -> None:
    buf = ArrayChunkBuffer(8, 256)
    tier = HeldTier(buf)
    m, _ = make_manager([tier], buffer=buf, num_chunks=8)
    m.on_new_request(R1)
    m.on_request_finished(R1)
    m.on_request_finished(R1)
    assert tier.calls.count(("finished", "r1")) == 1


def test_request_level_chunk_offered_again_while_writing_cascades_once() -> None:
    """Scenario: a request-level request offers a chunk again while it is still
    writing it: the chunk reaches the tier once, and its finish is forwarded once."""
    buf = ArrayChunkBuffer(8, 256)
    whole = HeldTier(buf, name="whole", policy=OffloadPolicy.REQUEST_LEVEL)
    m, engine = make_manager([whole], buffer=buf, num_chunks=8)
    m.on_new_request(R1)
    engine.store(keys(1), R1, complete=False)
    assert m.prepare_store(keys(1), R1) is not None
    m.on_request_finished(R1)
    m.complete_store(keys(1), R1)
    assert whole.stored_keys() == keys(1)
    assert whole.calls.count(("finished", "r1")) == 1


def test_chunk_its_writer_cascades_and_a_request_parked_reaches_a_tier_once() -> None:
    """Scenario: r1 (every tier) is writing chunk 1 when r2 (request level) offers
    it, which parks it for r2. When r1's write completes, the request-level tier
    receives chunk 1 once: one store, one chunk of its in-flight bound (chunk 2
    still fits, nothing is shed), and one stored event."""
    buf = ArrayChunkBuffer(8, 256)
    whole = HeldTier(
        buf,
        name="whole",
        policy=OffloadPolicy.REQUEST_LEVEL,
        auto=False,
        max_inflight_chunks=2,
    )
    m, engine = make_manager([whole], buffer=buf, num_chunks=8)
    r2 = ReqContext("r2")
    m.on_new_request(R1)
    m.on_new_request(r2)
    engine.store(keys(1), R1, complete=False)
    out = m.prepare_store(keys(1), r2)
    assert out is not None and out.keys_to_store == ()
    m.on_request_finished(r2)
    m.complete_store(keys(1), R1)
    engine.store(keys(2), R1)
    assert whole.stored_keys() == keys(1, 2)
    assert m.get_stats()["whole"].drops == 0
    assert whole.calls.count(("finished", "r2")) == 1
