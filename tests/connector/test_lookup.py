"""When a lookup defers, and for how long (SPEC §3.7 lookup and no convoy).

A request waits only for chunks it could load once they are readable, and only
for `max_defer_s` in all, however often the engine asks again.
"""

from __future__ import annotations

from typing import Any

from kvoffload import CPUOffloadingManager, ReqContext
from kvoffload.connector import (
    ConnectorConfig,
    GroupSpec,
    OffloadConnector,
    ScheduledRequest,
)
from kvoffload.engine_model import SimClock, SimRequest
from kvoffload.keys import BlockHasher, OffloadKey, chunk_keys
from kvoffload.worker.base import JobResult

WRITER = ReqContext("writer")


def _connector(
    *groups: GroupSpec, max_defer_s: float = 1.0
) -> tuple[OffloadConnector, CPUOffloadingManager, SimClock]:
    clock = SimClock()
    manager = CPUOffloadingManager(64)
    config = ConnectorConfig(groups, max_defer_s=max_defer_s)
    return OffloadConnector(config, manager, clock=clock), manager, clock


def _request(
    req_id: str, tokens: list[int], block: int, params: dict[str, Any] | None = None
) -> SimRequest:
    hashes = BlockHasher(block).hash_blocks(tokens)
    return SimRequest(req_id, 0.0, len(tokens), 1, hashes, block, params)


def _keys(req: SimRequest, blocks_per_chunk: int, group: int = 0) -> list[OffloadKey]:
    return chunk_keys(list(req.block_hashes), blocks_per_chunk, group)


def _store(
    manager: CPUOffloadingManager, readable: list[OffloadKey], writing: list[OffloadKey]
) -> None:
    """Another request's stores: `readable` landed, `writing` is still in flight."""
    done = manager.prepare_store(readable, WRITER)
    assert done is not None
    manager.complete_store(done.keys_to_store, WRITER)
    assert manager.prepare_store(writing, WRITER) is not None


# -- what a lookup waits for -----------------------------------------------------


def test_a_repeated_prompt_does_not_wait_for_the_chunk_holding_its_last_token() -> None:
    """Scenario: A's 32-token prompt (two chunks of one 16-token block) is being
    stored: chunk 0 has landed, chunk 1 is in flight. B, the same prompt, gets
    chunk 0 at once: chunk 1 holds its last token, which the engine computes
    itself, so waiting for it could add nothing."""
    connector, manager, _ = _connector(GroupSpec(16, 1))
    b = _request("B", list(range(32)), 16)
    keys = _keys(b, 1)
    _store(manager, keys[:1], keys[1:])
    assert connector.get_num_new_matched_tokens(b, 0) == 16
    assert connector.get_stats().deferrals == 0


def test_a_request_does_not_wait_for_chunks_past_its_max_load_tokens() -> None:
    """Scenario: of four 12-token chunks, chunk 0 is readable and chunks 1-3 are
    being stored. B, capped at 12 tokens, gets chunk 0 at once; C, uncapped,
    waits for the rest."""
    connector, manager, _ = _connector(GroupSpec(4, 3))
    tokens = list(range(52))
    b = _request("B", tokens, 4, {"max_load_tokens": 12})
    keys = _keys(b, 3)
    _store(manager, keys[:1], keys[1:])
    assert connector.get_num_new_matched_tokens(b, 0) == 12
    c = _request("C", tokens, 4)
    assert connector.get_num_new_matched_tokens(c, 0) is None


def test_a_miss_in_one_group_ends_what_another_groups_pending_chunks_could_add() -> (
    None
):
    """Scenario: a hybrid model, both groups with 4-token blocks, group 1 with
    two blocks a chunk. Group 0 has only its chunk 0 readable; group 1 has chunk
    0 readable and chunk 1 in flight. A prefix counts only as far as every group
    serves it, so waiting for group 1 could add nothing: 4 tokens, at once."""
    connector, manager, _ = _connector(GroupSpec(4, 1), GroupSpec(4, 2))
    r = _request("R", list(range(40)), 4)
    g0, g1 = _keys(r, 1, 0), _keys(r, 2, 1)
    _store(manager, [g0[0], g1[0]], [g1[1]])
    assert connector.get_num_new_matched_tokens(r, 0) == 4


def test_a_request_does_not_wait_for_another_requests_load_it_could_not_use() -> None:
    """Scenario (no convoy): A's 48-token prompt is in host memory (three chunks
    of one 16-token block) and L, on the same prompt, is loading it into the
    engine. B's 32-token prompt repeats A's first two chunks, the engine holds
    the first: L loads B's chunk 1, but it holds B's last token, which the engine
    computes itself, so B goes ahead at once. D, with nothing on the device,
    waits for L's load (it lands in the engine's prefix cache)."""
    connector, manager, _ = _connector(GroupSpec(16, 1))
    tokens = list(range(49))
    loader = _request("L", tokens, 16)
    _store(manager, _keys(loader, 1), [])
    connector.on_new_request(loader)
    assert connector.get_num_new_matched_tokens(loader, 0) == 48
    connector.update_state_after_alloc("L", [[1, 2, 3, 4]], 0, 48)
    assert connector.build_step([]).loads, "L's load is in flight"

    b = _request("B", tokens[:32], 16)
    assert connector.get_num_new_matched_tokens(b, 16) == 0
    d = _request("D", tokens, 16)
    assert connector.get_num_new_matched_tokens(d, 0) is None


# -- how long it waits -------------------------------------------------------------


def _waiting_for_a_store(
    max_defer_s: float,
) -> tuple[OffloadConnector, SimRequest, SimClock]:
    """R's four chunks are being stored by another request, which never lands."""
    connector, manager, clock = _connector(GroupSpec(4, 3), max_defer_s=max_defer_s)
    r = _request("R", list(range(52)), 4)
    _store(manager, [], _keys(r, 3))
    return connector, r, clock


def test_a_deferral_ends_after_max_defer_s_however_often_the_engine_asks() -> None:
    """Scenario: the engine asks every 0.25 s (vLLM asks each step while it cannot
    schedule the request, for want of blocks, say). R waits 1 s from its first
    deferral, then is answered every time it is asked until it is admitted."""
    connector, r, clock = _waiting_for_a_store(max_defer_s=1.0)
    answers = []
    for step in range(13):
        clock.now = step * 0.25
        answers.append(connector.get_num_new_matched_tokens(r, 0))
    assert answers == [None] * 4 + [0] * 9


def test_max_defer_s_zero_never_defers() -> None:
    connector, r, _ = _waiting_for_a_store(max_defer_s=0.0)
    assert connector.get_num_new_matched_tokens(r, 0) == 0
    assert connector.get_stats().deferrals == 0


def test_a_preempted_request_may_wait_again() -> None:
    """Scenario: R waited its full bound, was admitted and ran, then was
    preempted. Looked up again, it may wait anew for chunks in flight."""
    connector, r, clock = _waiting_for_a_store(max_defer_s=1.0)
    assert connector.get_num_new_matched_tokens(r, 0) is None
    clock.now = 1.0
    assert connector.get_num_new_matched_tokens(r, 0) == 0
    connector.update_state_after_alloc("R", [list(range(1, 14))], 0, 0)
    plan = connector.build_step([ScheduledRequest("R", 0, 52)])
    connector.on_job_results([JobResult(job.job_id, True) for job in plan.stores])
    connector.on_preempted(["R"])
    clock.now = 5.0
    assert connector.get_num_new_matched_tokens(r, 0) is None
