"""When the connector tells the tiers that a request used its chunks.

With an engine prefix cache, a request's hits count as used once the engine lets
go of its blocks (it allocates one of them afresh), after that step's stores;
its new chunks count as used when stored. Without one, its loads count at once
and its prompt's chunks when the prompt is computed.
"""

from __future__ import annotations

from collections.abc import Sequence, Set

import pytest

from kvoffload import CPUOffloadingManager, ReqContext
from kvoffload.connector import (
    ConnectorConfig,
    GroupSpec,
    OffloadConnector,
    ScheduledRequest,
)
from kvoffload.engine_model import SimRequest
from kvoffload.keys import BlockHasher, OffloadKey, chunk_keys
from kvoffload.tiers.base import PrepareStoreOutput
from kvoffload.worker.base import JobResult

HASHER = BlockHasher(4)
A = list(range(9))  # two chunks of one 4-token block, and a token


class Calls(CPUOffloadingManager):
    """The primary tier, logging stores and touches as (call, request, keys)."""

    def __init__(self, num_chunks: int) -> None:
        super().__init__(num_chunks)
        self.log: list[tuple[str, str, list[OffloadKey]]] = []

    def prepare_store(
        self,
        keys: Sequence[OffloadKey],
        ctx: ReqContext,
        *,
        may_evict: bool = True,
        keep_loaded: bool = True,
        promotion: bool = False,
        protect: Sequence[OffloadKey] = (),
    ) -> PrepareStoreOutput | None:
        self.log.append(("store", ctx.req_id, list(keys)))
        return super().prepare_store(
            keys,
            ctx,
            may_evict=may_evict,
            keep_loaded=keep_loaded,
            promotion=promotion,
            protect=protect,
        )

    def touch(
        self,
        keys: Sequence[OffloadKey],
        ctx: ReqContext,
        *,
        stored: Set[OffloadKey] | None = None,
    ) -> None:
        self.log.append(("touch", ctx.req_id, list(keys)))
        super().touch(keys, ctx, stored=stored)

    def take(self) -> list[tuple[str, str, list[OffloadKey]]]:
        log, self.log = self.log, []
        return log


def _setup(prefix_caching: bool) -> tuple[OffloadConnector, Calls]:
    manager = Calls(8)
    config = ConnectorConfig((GroupSpec(4, 1),), engine_prefix_caching=prefix_caching)
    return OffloadConnector(config, manager), manager


def _request(connector: OffloadConnector, req_id: str, tokens: list[int]) -> SimRequest:
    req = SimRequest(req_id, 0.0, len(tokens), 1, HASHER.hash_blocks(tokens), 4)
    connector.on_new_request(req)
    return req


def _computes(connector: OffloadConnector, req_id: str, blocks: list[int]) -> None:
    """The request's whole prompt runs in one step on `blocks`; its stores land."""
    connector.update_state_after_alloc(req_id, [blocks], 0, 0)
    plan = connector.build_step(
        [ScheduledRequest(req_id, 0, 9, (tuple(blocks),), replace_block_ids=True)]
    )
    connector.on_job_results([JobResult(job.job_id, True) for job in plan.stores])


def _keys(tokens: list[int]) -> list[OffloadKey]:
    return chunk_keys(HASHER.hash_blocks(tokens), 1, 0)


def test_with_a_prefix_cache_hits_count_when_the_engine_lets_go() -> None:
    """Scenario: A computes its prompt (chunks a0, a1) on blocks 1-3 and finishes;
    the engine keeps the blocks. A's new chunks count as used when stored, head
    last; nothing else until B is given block 3 afresh: then A's chunks are
    touched, head last, after B's stores in that step."""
    connector, manager = _setup(prefix_caching=True)
    a0, a1 = _keys(A)
    _request(connector, "A", A)
    _computes(connector, "A", [1, 2, 3])
    assert manager.take() == [("store", "A", [a0, a1]), ("touch", "A", [a0, a1])]
    connector.request_finished("A")
    b = list(range(100, 109))
    _request(connector, "B", b)
    _computes(connector, "B", [4, 5, 6])  # blocks A never held: A stays untouched
    assert [(call, req) for call, req, _ in manager.take()] == [
        ("store", "B"),
        ("touch", "B"),
    ]
    connector.request_finished("B")
    _request(connector, "C", list(range(200, 209)))
    _computes(connector, "C", [7, 3, 8])
    assert [(call, req) for call, req, _ in manager.take()] == [
        ("store", "C"),
        ("touch", "C"),
        ("touch", "A"),
    ]


def test_with_a_prefix_cache_a_load_is_not_a_use_until_the_engine_lets_go() -> None:
    """Scenario: A's chunks are stored; B (A's prompt and more) loads both and
    stores its third chunk. B's load touches nothing; once B finished and the
    engine gave one of its blocks to C, B's touch names what it loaded, head last,
    then its own chunk."""
    connector, manager = _setup(prefix_caching=True)
    _request(connector, "A", A)
    _computes(connector, "A", [1, 2, 3])
    connector.request_finished("A")
    tokens = A[:8] + list(range(50, 55))
    b = _request(connector, "B", tokens)
    assert connector.get_num_new_matched_tokens(b, 0) == 8
    manager.take()
    connector.update_state_after_alloc("B", [[4, 5, 6, 7]], 0, 8)
    (load,) = connector.build_step([]).loads
    connector.on_job_results([JobResult(load.job_id, True)])
    assert connector.take_load_results() == (["B"], [])
    assert [call for call, _, _ in manager.take()] == []
    plan = connector.build_step([ScheduledRequest("B", 8, 5, ())])
    connector.on_job_results([JobResult(job.job_id, True) for job in plan.stores])
    connector.request_finished("B")
    assert [(call, req) for call, req, _ in manager.take()] == [
        ("store", "B"),
        ("touch", "B"),
    ]
    _request(connector, "C", list(range(300, 309)))
    _computes(connector, "C", [9, 7, 10])
    assert manager.take()[-1] == ("touch", "B", _keys(tokens))


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_without_a_prefix_cache_uses_count_at_once(prefix_caching: bool) -> None:
    """Scenario: B loads A's two chunks. Without an engine prefix cache the load is
    a use (B's stores must not evict the only copy its conversation will have),
    and B's prompt is touched once computed; with one, neither happens yet."""
    connector, manager = _setup(prefix_caching)
    _request(connector, "A", A)
    _computes(connector, "A", [1, 2, 3])
    connector.request_finished("A")
    manager.take()
    b = _request(connector, "B", [*A[:8], 77])
    assert connector.get_num_new_matched_tokens(b, 0) == 8
    connector.update_state_after_alloc("B", [[4, 5, 6]], 0, 8)
    expected = [] if prefix_caching else [("touch", "B", _keys(A))]
    assert manager.take() == expected


def _runs_on_hit(
    connector: OffloadConnector,
    req_id: str,
    tokens: list[int],
    blocks: list[int],
    hit: int = 4,
) -> None:
    """The request's first `hit` tokens are the engine's own hit (on the first
    blocks); the rest of its prompt runs in one step; its stores land."""
    req = _request(connector, req_id, tokens)
    assert connector.get_num_new_matched_tokens(req, hit) == 0
    connector.update_state_after_alloc(req_id, [blocks], hit, 0)
    step = ScheduledRequest(
        req_id, hit, len(tokens) - hit, (tuple(blocks),), replace_block_ids=True
    )
    plan = connector.build_step([step])
    connector.on_job_results([JobResult(job.job_id, True) for job in plan.stores])


SHARED = [1000, 1001, 1002, 1003]  # a system prompt: one chunk


@pytest.mark.parametrize("continues", [False, True])
def test_a_shared_prefix_another_conversation_keeps_in_the_engine_is_not_touched(
    continues: bool,
) -> None:
    """Scenario: A computes the shared chunk s and its own on blocks 1-3; B (s and
    its own chunk b) hits s in the engine (block 1) and finishes. C hits s too and
    is given B's block 5: B's release is due while C, live, holds s in the engine.
    C is another conversation: B's touch leaves s out (the engine keeps it while
    any conversation using it runs). C continues B's conversation (it holds B's
    last chunk, and the engine's copy of s leaves with it): s is touched. Once C
    ends and its own release falls due, nobody holds s: C touches it."""
    connector, manager = _setup(prefix_caching=True)
    _request(connector, "A", [*SHARED, *range(5)])
    _computes(connector, "A", [1, 2, 3])
    connector.request_finished("A")
    b_tokens = [*SHARED, *range(100, 105)]
    s, b1 = _keys(b_tokens)
    _runs_on_hit(connector, "B", b_tokens, [1, 4, 5])
    connector.request_finished("B")
    manager.take()
    if continues:
        c_tokens = [*b_tokens[:8], *range(200, 205)]
        _runs_on_hit(connector, "C", c_tokens, [1, 4, 5, 6], hit=8)
    else:
        c_tokens = [*SHARED, *range(200, 205)]
        _runs_on_hit(connector, "C", c_tokens, [1, 5, 6])
    touched = [
        keys for call, req, keys in manager.take() if (call, req) == ("touch", "B")
    ]
    assert touched == ([[s, b1]] if continues else [[b1]])
    connector.request_finished("C")
    _runs_on_hit(connector, "D", [*range(300, 309)], [7, 6, 8], hit=0)
    touched = [
        keys for call, req, keys in manager.take() if (call, req) == ("touch", "C")
    ]
    assert touched == [_keys(c_tokens)]
