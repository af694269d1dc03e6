"""What gets loaded: hits past the device, mid-chunk starts, caps, deferral, failures."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvoffload import CPUOffloadingManager, ReqContext
from kvoffload.connector import (
    ConnectorConfig,
    GroupSpec,
    OffloadConnector,
    ScheduledRequest,
)
from kvoffload.engine_model import SimClock, SimRequest
from kvoffload.keys import BlockHasher, OffloadKey, chunk_keys
from kvoffload.worker.base import JobResult, TransferDirection

from .conftest import Harness

CHUNK = 12


def _fill_device(h: Harness, n: int = 3) -> None:
    h.run(*[h.request(f"filler-{i}", h.tokens(6 * CHUNK)) for i in range(n)])


def test_repeat_after_device_eviction_loads_the_prefix(async_scheduling: bool) -> None:
    """Scenario: A, then unrelated requests evict A from the device, then A again."""
    h = Harness(async_scheduling=async_scheduling, device_blocks=30)
    prompt = h.tokens(4 * CHUNK + 5)
    first = h.request("A1", prompt)
    h.run(first)
    _fill_device(h)
    again = h.request("A2", prompt)
    h.run(again)
    assert first.loaded_tokens == 0
    assert again.device_hit_tokens == 0
    assert again.loaded_tokens == 4 * CHUNK
    assert again.ttft is not None and first.ttft is not None
    assert again.ttft < first.ttft


def test_the_observer_hears_each_stored_chunk_once_and_every_loaded_one() -> None:
    heard: list[tuple[str, int, list[tuple[int, OffloadKey]]]] = []
    h = Harness(
        device_blocks=30, observer=lambda r, g, chunks: heard.append((r, g, chunks))
    )
    prompt = h.tokens(4 * CHUNK + 5)
    first = h.request("A1", prompt)
    h.run(first)
    _fill_device(h)
    h.run(h.request("A2", prompt))
    a_keys = list(enumerate(chunk_keys(list(first.hashes), 3, 0)))[:4]
    stored = [c for r, _, chunks in heard if r == "A1" for c in chunks]
    assert stored == a_keys, "A's whole prompt chunks, in order, once"
    loaded = [(g, chunks) for r, g, chunks in heard if r == "A2"]
    assert loaded == [(0, a_keys)], "A2 loads them all and stores nothing new"


def _b_repeats_a_with_its_first_block_on_the_device(h: Harness) -> SimRequest:
    """A's three chunks reach the host tier; the device keeps only A's first
    block (re-cached by C); B repeats A and runs. Returns B."""
    prompt = h.tokens(3 * CHUNK)
    h.run(h.request("A", prompt + h.tokens(1)))
    _fill_device(h)
    h.run(h.request("C", prompt[:4] + h.tokens(1), output=h.tokens(1)))
    b = h.request("B", prompt + h.tokens(1))
    h.run(b)
    return b


def test_hit_starting_mid_chunk_loads_only_the_missing_blocks(
    async_scheduling: bool,
) -> None:
    """Scenario: blocks_per_chunk 3, block size 4. The device still holds A's first
    block (re-cached by C); A's three chunks are in the host tier. B repeats A: the
    load starts at block 1, inside chunk 0."""
    h = Harness(async_scheduling=async_scheduling, device_blocks=30)
    b = _b_repeats_a_with_its_first_block_on_the_device(h)
    assert (b.device_hit_tokens, b.loaded_tokens) == (4, 3 * CHUNK - 4)
    load = h.connector.loads()[-1]
    (group,) = load.groups
    assert len(group.engine_blocks) == 8
    assert [hb % 3 for hb in group.host_blocks] == [1, 2, 0, 1, 2, 0, 1, 2]
    assert len(set(group.engine_blocks)) == 8


def test_the_tier_counts_the_hit_tokens_loaded_from_a_mid_chunk_start() -> None:
    """Scenario as above: B loads A's three chunks but the first block of chunk
    0, which the device still holds. The host tier is credited with exactly the
    tokens B loaded, as the connector is."""
    h = Harness(device_blocks=30)
    b = _b_repeats_a_with_its_first_block_on_the_device(h)
    assert b.loaded_tokens == 3 * CHUNK - 4
    assert h.manager.get_stats()["cpu"].hit_tokens == b.loaded_tokens
    assert h.connector.get_stats().hit_tokens == b.loaded_tokens


def test_a_full_prompt_hit_leaves_the_last_token_to_the_engine(
    async_scheduling: bool,
) -> None:
    """Scenario: the prompt is exactly 3 chunks and all are offloaded."""
    h = Harness(async_scheduling=async_scheduling, device_blocks=30)
    prompt = h.tokens(3 * CHUNK)
    h.run(h.request("A", prompt))
    _fill_device(h)
    b = h.request("B", prompt)
    h.run(b)
    # 35 tokens could be loaded, aligned down to the 4-token block: 32.
    assert b.loaded_tokens == 32


@pytest.mark.parametrize(
    ("cap", "loaded"), [(None, 48), (0, 0), (12, 12), (13, 12), (30, 28)]
)
def test_max_load_tokens(async_scheduling: bool, cap: int | None, loaded: int) -> None:
    """Scenario: 4 chunks offloaded; B asks to load at most `cap` tokens."""
    h = Harness(async_scheduling=async_scheduling, device_blocks=30)
    prompt = h.tokens(4 * CHUNK)
    h.run(h.request("A", prompt + h.tokens(1)))
    _fill_device(h)
    params = None if cap is None else {"max_load_tokens": cap}
    b = h.request("B", prompt + h.tokens(1), params=params)
    h.run(b)
    assert b.loaded_tokens == loaded


def test_less_than_a_chunk_past_the_device_hit_is_not_loaded(
    async_scheduling: bool,
) -> None:
    h = Harness(async_scheduling=async_scheduling, device_blocks=30)
    prompt = h.tokens(CHUNK)
    h.run(h.request("A", prompt + h.tokens(1)))
    _fill_device(h)
    h.run(h.request("C", prompt[:4] + h.tokens(1), output=h.tokens(1)))
    b = h.request("B", prompt + h.tokens(1))
    h.run(b)
    assert (b.device_hit_tokens, b.loaded_tokens) == (4, 0)


def test_failed_load_recomputes_and_serving_continues(async_scheduling: bool) -> None:
    h = Harness(
        async_scheduling=async_scheduling,
        device_blocks=30,
        fail_job=lambda job: job.direction is TransferDirection.LOAD,
    )
    prompt = h.tokens(4 * CHUNK)
    h.run(h.request("A", prompt + h.tokens(1)))
    _fill_device(h)
    b = h.request("B", prompt + h.tokens(1))
    h.run(b)
    assert b.num_output == b.max_output_tokens and b.first_token_time is not None
    assert b.loaded_tokens == 0
    stats = h.connector.get_stats()
    assert stats.failed_load_jobs == 1 and stats.chunks_loaded == 0
    assert h.connector.num_live_requests() == 0


def test_a_load_whose_chunks_are_gone_recomputes_and_serving_continues(
    async_scheduling: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario: the host tier no longer has the chunks B's lookup counted when
    B's load is planned (`prepare_load` answers None): the load fails through
    the worker and B recomputes its prompt and finishes."""
    h = Harness(async_scheduling=async_scheduling, device_blocks=30)
    prompt = h.tokens(4 * CHUNK)
    h.run(h.request("A", prompt + h.tokens(1)))
    _fill_device(h)
    monkeypatch.setattr(h.manager, "prepare_load", lambda keys, ctx: None)
    b = h.request("B", prompt + h.tokens(1))
    h.run(b)
    assert b.num_output == b.max_output_tokens and b.first_token_time is not None
    assert b.loaded_tokens == 0
    assert h.connector.get_stats().failed_load_jobs == 1
    assert h.connector.num_live_requests() == 0


def test_failed_store_leaves_nothing_readable(async_scheduling: bool) -> None:
    h = Harness(
        async_scheduling=async_scheduling,
        fail_job=lambda job: job.direction is TransferDirection.STORE,
    )
    a = h.request("A", h.tokens(3 * CHUNK))
    h.run(a)
    assert h.manager.get_stats()["cpu"].occupancy == 0
    assert h.connector.get_stats().failed_store_jobs >= 1


def _lookup_harness() -> tuple[
    OffloadConnector, CPUOffloadingManager, SimClock, BlockHasher
]:
    clock = SimClock()
    manager = CPUOffloadingManager(16)
    config = ConnectorConfig((GroupSpec(4, 3),), max_defer_s=0.5)
    return (
        OffloadConnector(config, manager, clock=clock),
        manager,
        clock,
        BlockHasher(4),
    )


def _sim(req_id: str, tokens: list[int], hasher: BlockHasher) -> SimRequest:
    return SimRequest(req_id, 0.0, len(tokens), 1, hasher.hash_blocks(tokens), 4)


def _b_finds_what_a_stored(
    connector: OffloadConnector, hasher: BlockHasher
) -> tuple[SimRequest, SimRequest]:
    """A computes a 40-token prompt and stores its chunks; B, on the same prompt,
    then finds 36 tokens (all but the last chunk's last token) in host memory."""
    tokens = list(range(40))
    a = _sim("A", tokens, hasher)
    connector.on_new_request(a)
    assert connector.get_num_new_matched_tokens(a, 0) == 0
    connector.update_state_after_alloc("A", [list(range(10))], 0, 0)
    (store,) = connector.build_step([ScheduledRequest("A", 0, 40)]).stores
    connector.on_job_results([JobResult(store.job_id, True)])
    connector.request_finished("A")
    b = _sim("B", tokens, hasher)
    connector.on_new_request(b)
    assert connector.get_num_new_matched_tokens(b, 0) == 36
    return a, b


def test_pending_chunks_defer_the_lookup_for_a_bounded_time() -> None:
    connector, manager, clock, hasher = _lookup_harness()
    tokens = list(range(40))
    writer = _sim("writer", tokens, hasher)
    connector.on_new_request(writer)
    keys = _keys(writer)
    manager.prepare_store(keys[:2], ReqContext("writer"))  # in flight, never completes
    out = manager.prepare_store(keys[2:], ReqContext("writer"))
    assert out is not None
    manager.complete_store(out.keys_to_store, ReqContext("writer"))
    reader = _sim("reader", tokens, hasher)
    assert connector.get_num_new_matched_tokens(reader, 0) is None
    clock.now = 0.4
    assert connector.get_num_new_matched_tokens(reader, 0) is None
    clock.now = 0.6
    assert connector.get_num_new_matched_tokens(reader, 0) == 0
    assert connector.get_stats().deferrals == 2


def test_retry_lookups_defer_too() -> None:
    class Unsure(CPUOffloadingManager):
        def lookup_prefix(self, keys, ctx):  # type: ignore[no-untyped-def]
            found = super().lookup_prefix(keys, ctx)
            return found._replace(retry=True)

    clock = SimClock()
    connector = OffloadConnector(
        ConnectorConfig((GroupSpec(4, 3),), max_defer_s=0.5), Unsure(4), clock=clock
    )
    req = _sim("r", list(range(30)), BlockHasher(4))
    assert connector.get_num_new_matched_tokens(req, 0) is None
    clock.now = 1.0
    assert connector.get_num_new_matched_tokens(req, 0) == 0


def test_a_load_whose_chunks_left_the_host_tier_fails_cleanly() -> None:
    """Scenario: between B's lookup and the planning of its load, another
    request's stores evict the chunks B counted. B's load is planned as failed,
    pinning nothing; the worker reports it failed like any failed load (the
    engine recomputes) and B does not try to load again."""
    connector, manager, _, hasher = _lookup_harness()
    a, b = _b_finds_what_a_stored(connector, hasher)
    _push_out_of_host_memory(manager)

    connector.update_state_after_alloc("B", [list(range(20, 30))], 0, 36)
    (load,) = connector.build_step([]).loads
    assert load.fail and load.groups == ()
    connector.on_job_results([JobResult(load.job_id, False)])
    assert connector.take_load_results() == ([], ["B"])
    assert connector.get_stats().failed_load_jobs == 1
    assert connector.get_num_new_matched_tokens(b, 0) == 0
    assert manager.prepare_store(_keys(a), ReqContext("another")) is not None, (
        "nothing pinned"
    )


def _push_out_of_host_memory(manager: CPUOffloadingManager) -> None:
    """Another request's stores take every slot of the host tier."""
    other = ReqContext("other")
    evicting = [OffloadKey(bytes([i]) * 36) for i in range(16)]
    assert manager.prepare_store(evicting, other) is not None
    manager.complete_store(evicting, other)


def _fail_before_planning(
    connector: OffloadConnector, manager: CPUOffloadingManager
) -> None:
    _push_out_of_host_memory(manager)
    connector.update_state_after_alloc("B", [list(range(20, 30))], 0, 36)
    (load,) = connector.build_step([]).loads
    connector.on_job_results([JobResult(load.job_id, False)])


def _fail_in_the_worker(
    connector: OffloadConnector, manager: CPUOffloadingManager
) -> None:
    connector.update_state_after_alloc("B", [list(range(20, 30))], 0, 36)
    (load,) = connector.build_step([]).loads
    connector.on_job_results([JobResult(load.job_id, False)])
    _push_out_of_host_memory(manager)


def _fail_by_a_reset(
    connector: OffloadConnector, manager: CPUOffloadingManager
) -> None:
    connector.update_state_after_alloc("B", [list(range(20, 30))], 0, 36)
    (load,) = connector.build_step([]).loads
    connector.reset_cache()
    assert connector.build_step([]).stale_loads == (load.job_id,)
    connector.on_job_results([JobResult(load.job_id, False)])


@pytest.mark.parametrize(
    "fail_load",
    [_fail_before_planning, _fail_in_the_worker, _fail_by_a_reset],
    ids=["chunks-gone-before-planning", "worker-failed", "reset-while-loading"],
)
def test_chunks_a_request_recomputes_after_its_load_failed_are_stored(
    fail_load: Callable[[OffloadConnector, CPUOffloadingManager], None],
) -> None:
    """Scenario: B's lookup counts the three chunks A stored; B's load fails (its
    chunks left host memory before it was planned; the worker failed it and
    other stores then pushed them out; a reset dropped them while it ran), so B
    recomputes its prompt. B computed those chunks, so it stores them again
    (CHUNK_LEVEL), and C, on the same prompt, finds them in host memory."""
    connector, manager, _, hasher = _lookup_harness()
    _b_finds_what_a_stored(connector, hasher)
    fail_load(connector, manager)
    assert connector.take_load_results() == ([], ["B"])

    (store,) = connector.build_step([ScheduledRequest("B", 0, 40)]).stores
    connector.on_job_results([JobResult(store.job_id, True)])
    connector.request_finished("B")
    c = _sim("C", list(range(40)), hasher)
    connector.on_new_request(c)
    assert connector.get_num_new_matched_tokens(c, 0) == 36


def _keys(req: SimRequest) -> list[OffloadKey]:
    return chunk_keys(list(req.block_hashes), 3, 0)


def test_job_completes_only_when_every_rank_reported() -> None:
    clock = SimClock()
    manager = CPUOffloadingManager(16)
    connector = OffloadConnector(
        ConnectorConfig((GroupSpec(4, 3),), world_size=2), manager, clock=clock
    )
    req = _sim("r", list(range(30)), BlockHasher(4))
    connector.on_new_request(req)
    assert connector.get_num_new_matched_tokens(req, 0) == 0
    connector.update_state_after_alloc("r", [list(range(8))], 0, 0)
    plan = connector.build_step([ScheduledRequest("r", 0, 30)])
    (job,) = plan.stores
    assert plan.request_of[job.job_id] == "r"
    connector.on_job_results([JobResult(job.job_id, True, 100, 0.1)], rank=0)
    connector.on_job_results([JobResult(job.job_id, True, 100, 0.1)], rank=0)
    assert manager.get_stats()["cpu"].chunks_stored == 0
    connector.on_job_results([JobResult(job.job_id, True, 100, 0.1)], rank=1)
    assert manager.get_stats()["cpu"].chunks_stored == 2
    assert connector.get_stats().bytes_stored == 200


def test_the_null_block_is_never_loaded_into_or_stored_from() -> None:
    """Scenario: a sliding-window group whose table holds the null block 0 for
    blocks outside the window (as vLLM gives them)."""
    hasher = BlockHasher(4)
    manager = CPUOffloadingManager(16)
    config = ConnectorConfig((GroupSpec(4, 1),), null_block_id=0)
    connector = OffloadConnector(config, manager)
    tokens = list(range(25))
    a = _sim("A", tokens, hasher)
    connector.on_new_request(a)
    assert connector.get_num_new_matched_tokens(a, 0) == 0
    connector.update_state_after_alloc("A", [[0, 0, 7, 8, 9, 10, 11]], 0, 0)
    (store,) = connector.build_step([ScheduledRequest("A", 0, 25)]).stores
    (group,) = store.groups
    assert 0 not in group.engine_blocks and len(group.engine_blocks) == 4
    connector.on_job_results([JobResult(store.job_id, True)])
    connector.request_finished("A")
    # Chunks 2..5 are offloaded; a request whose engine holds the first 8 tokens
    # (null blocks outside its window) loads 16 more, skipping nothing real.
    b = _sim("B", tokens, hasher)
    connector.on_new_request(b)
    assert connector.get_num_new_matched_tokens(b, 8) == 16
    connector.update_state_after_alloc("B", [[0, 0, 3, 4, 5, 6]], 8, 16)
    (load,) = connector.build_step([]).loads
    assert load.groups[0].engine_blocks == (3, 4, 5, 6)


def test_after_a_failed_load_the_request_recomputes_instead_of_retrying() -> None:
    """Scenario: vLLM (kv_load_failure_policy="recompute") asks again after a
    failed load; the connector answers 0 rather than loading the same chunks again."""
    connector, _, _, hasher = _lookup_harness()
    _, b = _b_finds_what_a_stored(connector, hasher)
    connector.update_state_after_alloc("B", [list(range(20, 30))], 0, 36)
    (load,) = connector.build_step([]).loads
    connector.on_job_results([JobResult(load.job_id, False)])
    assert connector.take_load_results() == ([], ["B"])
    assert connector.get_num_new_matched_tokens(b, 0) == 0
    c = _sim("C", list(range(40)), hasher)  # another request still gets them
    connector.on_new_request(c)
    assert connector.get_num_new_matched_tokens(c, 0) == 36
