"""Engine blocks the engine hands to another request while the connector names them.

vLLM frees a running request's sliding-window blocks once they leave the window
(its own table then shows the null block 0; the connector is not told) and may
allocate them to any request, in any group: the groups share one block pool over
the same bytes. A chunk whose store was put off must then never be stored from
such a block, and a store still reading one must finish before it is rewritten.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kvoffload.connector import (
    ConnectorConfig,
    GroupSpec,
    OffloadConnector,
    ScheduledRequest,
    StepPlan,
)
from kvoffload.engine_model import SimRequest
from kvoffload.keys import BlockHasher, OffloadKey, chunk_keys, make_offload_key
from kvoffload.tiers.base import ReqContext
from kvoffload.worker.base import JobResult

from .conftest import RecordingManager

HASHER = BlockHasher(4)


def _request(connector: OffloadConnector, req_id: str, tokens: list[int]) -> SimRequest:
    req = SimRequest(req_id, 0.0, len(tokens), 1, HASHER.hash_blocks(tokens), 4)
    connector.on_new_request(req)
    assert connector.get_num_new_matched_tokens(req, 0) == 0
    return req


def _reads(plan: StepPlan, req_id: str, group: int) -> list[int]:
    """The engine blocks of `group` that `req_id`'s stores in `plan` read."""
    return [
        block
        for job in plan.stores
        if plan.request_of[job.job_id] == req_id
        for transfer in job.groups
        if transfer.group == group
        for block in transfer.engine_blocks
    ]


@dataclass
class PutOff:
    """A's chunk 0 (engine block 3 in group 0, block 5 in group 1, a sliding
    window) was computed in step 1 but found no host room: X's stores filled every
    slot. X's stores land; A has left block 5 behind its window (vLLM freed it)."""

    manager: RecordingManager
    connector: OffloadConnector
    a: SimRequest

    @classmethod
    def create(cls) -> PutOff:
        manager = RecordingManager(8)
        groups = (GroupSpec(4, 1), GroupSpec(4, 1))
        connector = OffloadConnector(ConnectorConfig(groups, null_block_id=0), manager)
        _request(connector, "X", list(range(100, 117)))
        a = _request(connector, "A", list(range(9)))
        connector.update_state_after_alloc(
            "X", [[11, 12, 13, 14], [15, 16, 17, 18]], 0, 0
        )
        connector.update_state_after_alloc("A", [[3], [5]], 0, 0)
        step1 = connector.build_step(
            [ScheduledRequest("X", 0, 16), ScheduledRequest("A", 0, 4)]
        )
        assert _reads(step1, "A", 1) == []  # put off: no room
        connector.on_job_results([JobResult(j.job_id, True) for j in step1.stores])
        return cls(manager, connector, a)

    def a_step(self) -> ScheduledRequest:
        """A computes its chunk 1 (engine blocks 4 and 6)."""
        return ScheduledRequest("A", 4, 4, ((4,), (6,)))

    def a_chunk0(self) -> OffloadKey:
        return chunk_keys(list(self.a.block_hashes), 1, 1)[0]


@pytest.mark.parametrize("a_first", [False, True], ids=["B-first", "A-first"])
@pytest.mark.parametrize("b_group", [1, 0], ids=["same-group", "full-group"])
@pytest.mark.parametrize("how", ["new", "running", "alloc-only", "A-waits"])
def test_a_put_off_chunk_is_never_stored_from_a_block_given_to_another_request(
    a_first: bool, b_group: int, how: str
) -> None:
    """Scenario: in step 2 the engine gives A's freed block 5 to B, in either
    group: B is new (`new`), running and growing its table (`running`), or only
    allocated, not scheduled, as while its prefix loads (`alloc-only`). A's chunk 0
    is offered again in step 2 (`A-waits`: in step 3): it must be skipped, not
    copied from B's KV under A's key."""
    s = PutOff.create()
    c = s.connector
    table = [(7,), (8,)]
    table[b_group] = (5,)
    _request(c, "B", list(range(50, 59)))
    b_step: list[ScheduledRequest] = []
    if how == "running":
        c.update_state_after_alloc("B", [[9], [10]], 0, 0)
        plan = c.build_step([ScheduledRequest("B", 0, 4, ((9,), (10,)), True)])
        c.on_job_results([JobResult(j.job_id, True) for j in plan.stores])
        b_step = [ScheduledRequest("B", 4, 4, tuple(table))]
    else:
        c.update_state_after_alloc("B", table, 0, 0)
        if how != "alloc-only":
            b_step = [ScheduledRequest("B", 0, 4, tuple(table), True)]
    a_step = [s.a_step()] if how != "A-waits" else []
    plans = [c.build_step(a_step + b_step if a_first else b_step + a_step)]
    if how == "A-waits":
        plans.append(c.build_step([s.a_step()]))
    assert [block for plan in plans for block in _reads(plan, "A", 1)] == [6]
    assert s.a_chunk0() not in s.manager.offered["A"]


@pytest.mark.parametrize("hit", [False, True], ids=["free", "hit"])
def test_a_put_off_chunk_is_stored_while_its_block_holds_its_kv(hit: bool) -> None:
    """Scenario: A's block 5 stays free, or B takes it as an engine prefix-cache
    hit (B shares A's first 4 tokens; the block keeps A's KV): A's chunk 0 is
    stored from it in step 2."""
    s = PutOff.create()
    c = s.connector
    _request(c, "B", list(range(4)) + list(range(60, 65)))
    table = [[3, 7], [5, 8]] if hit else [[7], [8]]
    c.update_state_after_alloc("B", table, 4 if hit else 0, 0)
    step2 = c.build_step([s.a_step()])
    assert _reads(step2, "A", 1) == [5, 6]
    assert s.a_chunk0() in s.manager.offered["A"]


def test_a_block_read_by_a_store_waits_for_it_in_whichever_group_it_returns() -> None:
    """Scenario: A's store reads block 7 of its sliding-window group; the engine
    frees it and hands it to B's full-attention group: B's step waits for it."""
    groups = (GroupSpec(4, 1), GroupSpec(4, 1))
    c = OffloadConnector(ConnectorConfig(groups, null_block_id=0), RecordingManager(8))
    _request(c, "A", list(range(5)))
    c.update_state_after_alloc("A", [[3], [7]], 0, 0)
    (store,) = c.build_step([ScheduledRequest("A", 0, 4)]).stores
    c.request_finished("A")
    _request(c, "B", list(range(50, 55)))
    c.update_state_after_alloc("B", [[7], [9]], 0, 0)
    assert c.build_step([ScheduledRequest("B", 0, 4)]).wait_for == (store.job_id,)


@pytest.mark.parametrize("early", [False, True], ids=["as-it-fills", "a-step-before"])
@pytest.mark.parametrize("b_group", [1, 0], ids=["same-group", "full-group"])
@pytest.mark.parametrize("how", ["new", "alloc-only"])
def test_a_block_freed_before_its_chunk_fills_is_never_stored_from(
    early: bool, b_group: int, how: str
) -> None:
    """Scenario: chunks of 3 blocks; A's step 1 computes 8 tokens (`early`: 7),
    in two blocks of its chunk 0. Its window (4 tokens) has left block 5 behind,
    so vLLM frees it and, in step 2, gives it to B. A fills chunk 0 in step 2
    (`early`: in step 3, after computing one token in step 2): the sliding
    group's chunk 0 is skipped, not copied from B's KV; the full group's is
    stored."""
    groups = (GroupSpec(4, 3), GroupSpec(4, 3))
    manager = RecordingManager(8)
    c = OffloadConnector(ConnectorConfig(groups, null_block_id=0), manager)
    a = _request(c, "A", list(range(13)))
    c.update_state_after_alloc("A", [[3, 4], [5, 6]], 0, 0)
    computed = 7 if early else 8
    assert c.build_step([ScheduledRequest("A", 0, computed)]).stores == ()
    table = [(10,), (11,)]
    table[b_group] = (5,)
    _request(c, "B", list(range(50, 59)))
    c.update_state_after_alloc("B", table, 0, 0)
    b_step = [ScheduledRequest("B", 0, 4, tuple(table), True)] if how == "new" else []
    plans = []
    if early:
        plans.append(c.build_step([ScheduledRequest("A", 7, 1), *b_step]))
        b_step = []
    plans.append(c.build_step([ScheduledRequest("A", 8, 4, ((7,), (9,))), *b_step]))
    assert [block for plan in plans for block in _reads(plan, "A", 0)] == [3, 4, 7]
    assert [block for plan in plans for block in _reads(plan, "A", 1)] == []
    sliding_chunk0 = chunk_keys(list(a.block_hashes), 3, 1)[0]
    assert sliding_chunk0 not in manager.offered["A"]


@dataclass
class Pinned:
    """Two groups (the second one sliding) of 4-token blocks, `per_chunk` blocks a
    chunk, over a host tier whose 8 slots hold other chunks being written: every
    store is put off until `room` frees some (their writes fail)."""

    manager: RecordingManager
    connector: OffloadConnector
    filler: list[OffloadKey]

    @classmethod
    def create(cls, per_chunk: int = 1) -> Pinned:
        manager = RecordingManager(8)
        ctx = ReqContext("filler")
        filler = [make_offload_key(bytes([i]) * 32, 0) for i in range(8)]
        assert manager.prepare_store(filler, ctx) is not None
        groups = (GroupSpec(4, per_chunk), GroupSpec(4, per_chunk))
        connector = OffloadConnector(ConnectorConfig(groups, null_block_id=0), manager)
        return cls(manager, connector, filler)

    def room(self, slots: int) -> None:
        self.manager.complete_store(self.filler[:slots], ReqContext("filler"), False)

    def give_fresh(self, req_id: str, table: list[list[int]]) -> None:
        """The engine allocates `table` afresh to a new request."""
        _request(self.connector, req_id, list(range(900, 905)))
        self.connector.update_state_after_alloc(req_id, table, 0, 0)


def test_blocks_appended_while_stores_are_put_off_are_guarded() -> None:
    """Scenario: A's chunks 0 and 1 are put off; chunk 1's blocks (4 and 6) came
    with A's step 2. A's window frees blocks 5 and 6; the engine gives 6 to B.
    With room, A stores both full-group chunks and its sliding chunk 0 (block 5,
    still A's KV), and skips sliding chunk 1."""
    s = Pinned.create()
    c = s.connector
    _request(c, "A", list(range(9)))
    c.update_state_after_alloc("A", [[3], [5]], 0, 0)
    c.build_step([ScheduledRequest("A", 0, 4)])
    assert c.build_step([ScheduledRequest("A", 4, 4, ((4,), (6,)))]).stores == ()
    s.give_fresh("B", [[10], [6]])
    s.room(8)
    plan = c.build_step([ScheduledRequest("A", 8, 1, ((7,), (8,)))])
    assert _reads(plan, "A", 0) == [3, 4]
    assert _reads(plan, "A", 1) == [5]


@pytest.mark.parametrize("how", ["preempted", "replaced", "reallocated"])
def test_a_new_table_is_guarded_and_the_old_one_is_not(how: str) -> None:
    """Scenario: A has chunk 0 put off (blocks 3 and 5), then a new table (blocks
    7, 9 and 8, 10): it is preempted and resumes (`preempted`), or, without a
    preemption, a step names its whole new table (`replaced`) or the engine
    allocates it (`reallocated`). Its stores are put off again. The engine gives
    A's old block 5 and its new block 8 (freed by A's window) to B. With room, A
    stores from its new table, skipping only sliding chunk 0."""
    s = Pinned.create()
    c = s.connector
    _request(c, "A", list(range(9)))
    c.update_state_after_alloc("A", [[3], [5]], 0, 0)
    c.build_step([ScheduledRequest("A", 0, 4)])
    if how == "preempted":
        c.on_preempted(["A"])
    if how != "replaced":
        c.update_state_after_alloc("A", [[7, 9], [8, 10]], 0, 0)
    table = ((7, 9), (8, 10)) if how != "reallocated" else ()
    step = ScheduledRequest("A", 0, 8, table, replace_block_ids=bool(table))
    assert c.build_step([step]).stores == ()
    s.give_fresh("B", [[5], [8]])
    s.room(8)
    plan = c.build_step([ScheduledRequest("A", 8, 1, ((11,), (12,)))])
    assert _reads(plan, "A", 0) == [7, 9]
    assert _reads(plan, "A", 1) == [10]


def test_chunks_left_behind_a_partial_store_stay_guarded() -> None:
    """Scenario: A's chunks 0 and 1 are put off in step 1; in step 2 there is room
    for two chunks: A stores chunk 0 of each group and puts off chunk 1 (blocks 4
    and 6). A's window frees 5 and 6; the engine gives both to B. With room, A
    stores its full-group chunk 1 and skips the sliding one."""
    s = Pinned.create()
    c = s.connector
    _request(c, "A", list(range(9)))
    c.update_state_after_alloc("A", [[3, 4], [5, 6]], 0, 0)
    assert c.build_step([ScheduledRequest("A", 0, 8)]).stores == ()
    s.room(2)
    second = c.build_step([ScheduledRequest("A", 8, 1, ((7,), (8,)))])
    assert (_reads(second, "A", 0), _reads(second, "A", 1)) == ([3], [5])
    c.on_job_results([JobResult(j.job_id, True) for j in second.stores])
    s.give_fresh("B", [[5], [6]])
    s.room(8)
    plan = c.build_step([ScheduledRequest("A", 9, 1)])
    assert _reads(plan, "A", 0) == [4]
    assert _reads(plan, "A", 1) == []


def test_a_block_two_requests_left_unstored_is_voided_in_both() -> None:
    """Scenario: chunks of 2 blocks; B's engine prefix-cache hit shares A's first
    blocks (3 and 5), so both hold block 5 in a chunk 0 they could not store. Both
    windows leave it, the engine frees it and gives it to C: with room, A and B
    each store their full-group chunk 0 and skip the sliding one."""
    s = Pinned.create(per_chunk=2)
    c = s.connector
    _request(c, "A", list(range(9)))
    _request(c, "B", list(range(4)) + list(range(70, 75)))
    c.update_state_after_alloc("A", [[3, 4], [5, 6]], 0, 0)
    c.update_state_after_alloc("B", [[3, 7], [5, 8]], 4, 0)
    assert (
        c.build_step([ScheduledRequest("A", 0, 8), ScheduledRequest("B", 4, 4)]).stores
        == ()
    )
    s.give_fresh("C", [[9], [5]])
    s.room(8)
    plan = c.build_step(
        [
            ScheduledRequest("A", 8, 1, ((10,), (11,))),
            ScheduledRequest("B", 8, 1, ((12,), (13,))),
        ]
    )
    assert (_reads(plan, "A", 0), _reads(plan, "B", 0)) == ([3, 4], [3, 7])
    assert (_reads(plan, "A", 1), _reads(plan, "B", 1)) == ([], [])
