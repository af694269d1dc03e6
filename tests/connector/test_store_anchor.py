"""What a store past the engine's own prefix hit may take and leave (issue 22).

With an engine prefix cache a request stores from the first chunk past the
engine's hit. A lookup walks the tier from the end of the engine's hit, so those
chunks can hit only while the tier, or the engine, holds the chunks before them:
a request bets on the engine letting go and skips chunks that follow one the
tier gave up, and offers the held ones before its stores with them, so that its
victims rank below them.
"""

from __future__ import annotations

from kvoffload import CPUOffloadingManager, ReqContext
from kvoffload.connector import (
    ConnectorConfig,
    GroupSpec,
    OffloadConnector,
    ScheduledRequest,
)
from kvoffload.engine_model import SimRequest
from kvoffload.keys import BlockHasher, OffloadKey, chunk_keys
from kvoffload.tiering import TieringManager
from kvoffload.tiers.secondary import ArrayChunkBuffer
from kvoffload.worker.base import JobResult
from tests.tiering.tiering_support import SLOT, HeldTier

HASHER = BlockHasher(4)
C = list(range(13))  # three chunks of one 4-token block, and a token


def _keys(tokens: list[int]) -> list[OffloadKey]:
    return chunk_keys(HASHER.hash_blocks(tokens), 1, 0)


def _setup(chunks: int) -> tuple[OffloadConnector, CPUOffloadingManager]:
    manager = CPUOffloadingManager(chunks)
    config = ConnectorConfig((GroupSpec(4, 1),), engine_prefix_caching=True)
    return OffloadConnector(config, manager), manager


def _run(
    connector: OffloadConnector,
    req_id: str,
    tokens: list[int],
    blocks: list[int],
    engine_hit: int = 0,
    params: dict[str, object] | None = None,
) -> int:
    """The request's prompt past its engine hit runs in one step; its stores
    land and it finishes. Returns the chunks it stored."""
    req = SimRequest(req_id, 0.0, len(tokens), 1, HASHER.hash_blocks(tokens), 4, params)
    connector.on_new_request(req)
    assert connector.get_num_new_matched_tokens(req, engine_hit) == 0
    connector.update_state_after_alloc(req_id, [blocks], engine_hit, 0)
    step = ScheduledRequest(
        req_id, engine_hit, len(tokens) - engine_hit, (tuple(blocks),), True
    )
    plan = connector.build_step([step])
    connector.on_job_results([JobResult(job.job_id, True) for job in plan.stores])
    connector.request_finished(req_id)
    return sum(len(t.engine_blocks) for job in plan.stores for t in job.groups)


def test_chunks_after_one_the_tier_gave_up_are_not_stored() -> None:
    """Scenario: C's first two chunks are in the engine's prefix cache, not in
    the host tier (which has room). Its third could hit only behind the second:
    it is skipped, and counted as skipped. Before, it was stored (and in a full
    tier it evicted a chunk that could hit)."""
    connector, manager = _setup(4)
    c0, c1, c2 = _keys(C)
    assert _run(connector, "C", C, [1, 2, 3, 4], engine_hit=8) == 0
    assert not any(manager.holds(k) for k in (c0, c1, c2))
    assert connector.get_stats().store_skipped == 1


def test_a_store_past_the_engine_hit_keeps_the_held_chunks_before_it() -> None:
    """Scenario: a tier of 3 chunks holds C's first two (head last, so its second
    chunk is the oldest) and, stored after them, X's. A next turn of C finds
    those two in the engine's prefix cache and stores its third. The tier would
    give up C's second chunk first, which would leave the third unable to hit:
    the store is refused instead, and the tier keeps what it had. Before, the
    store evicted C's second chunk."""
    connector, manager = _setup(3)
    c0, c1, c2 = _keys(C)
    (x0,) = _keys(list(range(100, 105)))
    assert _run(connector, "C1", C[:9], [1, 2, 3]) == 2
    assert _run(connector, "X", list(range(100, 105)), [9, 10]) == 1
    assert _run(connector, "C2", C, [1, 2, 3, 4], engine_hit=8) == 0
    assert [manager.holds(k) for k in (x0, c0, c1, c2)] == [True, True, True, False]


def test_the_held_chunks_before_a_store_are_its_prefix() -> None:
    """Scenario (the manager alone): present keys offered with a store rank it
    like chunks the request loaded: the store takes victims only from below
    them, and is refused where the policy would give one of them up first."""
    manager = CPUOffloadingManager(2)
    a, b, c, d = (bytes([i]) * 8 for i in range(4))
    for key in (a, b):
        out = manager.prepare_store([OffloadKey(key)], ReqContext("w"))
        assert out is not None
        manager.complete_store(out.keys_to_store, ReqContext("w"))
    ctx = ReqContext("r")
    assert manager.prepare_store([OffloadKey(a), OffloadKey(c)], ctx) is None
    assert manager.holds(OffloadKey(a)) and manager.holds(OffloadKey(b))
    out = manager.prepare_store([OffloadKey(b), OffloadKey(d)], ctx)
    assert out is not None and out.evicted_keys == (OffloadKey(a),)


def test_a_tier_stack_does_not_call_a_chunk_host_memory_lacks_a_gap() -> None:
    """Host memory's misses may be a promotion away in a secondary tier: a tier
    stack cannot tell, so a store past them goes ahead as before."""
    primary = CPUOffloadingManager(4)
    stack = TieringManager(primary, [HeldTier(ArrayChunkBuffer(4, SLOT))])
    config = ConnectorConfig((GroupSpec(4, 1),), engine_prefix_caching=True)
    connector = OffloadConnector(config, stack)
    c2 = _keys(C)[2]
    assert stack.holds(c2) is None
    assert _run(connector, "C", C, [1, 2, 3, 4], engine_hit=8) == 1
    assert primary.holds(c2)


def _answer_fills_second_chunk(connector: OffloadConnector) -> None:
    """A: 6 prompt tokens, stored (its first chunk), then 2 of its answer, which
    fill its second chunk in the engine (prompt-only stores never offer it)."""
    a = SimRequest("A", 0.0, 6, 2, HASHER.hash_blocks(C[:8]), 4)
    connector.on_new_request(a)
    assert connector.get_num_new_matched_tokens(a, 0) == 0
    connector.update_state_after_alloc("A", [[1, 2]], 0, 0)
    plan = connector.build_step([ScheduledRequest("A", 0, 6, ((1, 2),), True)])
    connector.on_job_results([JobResult(job.job_id, True) for job in plan.stores])
    a.num_output = 2
    connector.build_step([ScheduledRequest("A", 6, 1, (), False)])
    connector.request_finished("A")


def test_the_chunk_where_a_prompt_ended_is_stored_by_the_next_turn() -> None:
    """Scenario: A's prompt is 6 tokens; its answer fills its second chunk in
    the engine, which the tier never sees (prompt-only stores). B continues the
    conversation: the engine serves it both chunks, and B stores its third.
    The second is no chunk the tier gave up: B stores it with its third (it has
    it in its engine blocks), and a later request finds all three in the tier.
    Before, B skipped its third as behind a gap, and every later turn of the
    conversation did the same: the tier held its first chunk and nothing more."""
    connector, manager = _setup(8)
    _answer_fills_second_chunk(connector)
    c0, c1, c2 = _keys(C)
    assert manager.holds(c0) and not manager.holds(c1)
    assert _run(connector, "B", C, [1, 2, 3, 4], engine_hit=8) == 2
    assert all(manager.holds(k) for k in (c0, c1, c2))
    assert connector.get_stats().store_skipped == 0
    # Once stored, a gap there is one the tier made: D (the same conversation
    # again, after the tier lost all but c0) bets on the engine and skips.
    manager.reset_cache()
    assert _run(connector, "X", C[:4], [1]) == 1
    assert _run(connector, "D", C, [1, 2, 5, 6], engine_hit=8) == 0
    assert not manager.holds(c2)


def test_a_turn_the_engine_serves_whole_stores_the_chunk_never_offered() -> None:
    """Scenario: as above, but B's prompt ends inside its third chunk, so the
    engine's hit (A's two chunks) is all of B's whole chunks: B has nothing new
    to store, yet it holds A's second chunk, which the tier never had, in its
    engine blocks, and stores it. Before, nothing stored it until a turn with
    new chunks came, and a turn that lost it from the engine before then
    recomputed it (vLLM's connector, which stores every block of a prompt, had
    it)."""
    connector, manager = _setup(8)
    _answer_fills_second_chunk(connector)
    c0, c1, _ = _keys(C)
    assert manager.holds(c0) and not manager.holds(c1)
    # A request capped before that chunk (its first chunk only) leaves it.
    capped = {"max_offload_tokens": 4}
    assert _run(connector, "B0", C[:10], [1, 2, 3], 8, capped) == 0
    assert not manager.holds(c1)
    assert _run(connector, "B", C[:10], [1, 2, 3], engine_hit=8) == 1
    assert manager.holds(c1)
    assert _run(connector, "D", C[:10], [1, 2, 4], engine_hit=8) == 0  # once


def test_a_gap_the_tier_made_is_not_filled_from_the_engine() -> None:
    """The same turns, but A's second chunk was a prompt chunk it stored and
    the tier gave up: B bets the engine lets go too, and skips its third."""
    connector, manager = _setup(8)
    assert _run(connector, "A", C[:8], [1, 2]) == 2
    c0, c1, c2 = _keys(C)
    manager.reset_cache()
    assert _run(connector, "X", C[:4], [1]) == 1  # the tier has c0 again, not c1
    assert manager.holds(c0) and not manager.holds(c1)
    assert _run(connector, "B", C, [1, 2, 3, 4], engine_hit=8) == 0
    assert not manager.holds(c2)
