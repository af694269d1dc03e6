"""Hook order, preemption, abort and reset in the middle of transfers."""

from __future__ import annotations

import pytest

from kvoffload import CPUOffloadingManager, LookupResult, ReqContext
from kvoffload.connector import (
    ConnectorConfig,
    GroupSpec,
    OffloadConnector,
    ScheduledRequest,
)
from kvoffload.engine_model import SimRequest, TimeModel
from kvoffload.keys import BlockHasher
from kvoffload.worker.base import JobResult, TransferDirection, TransferJob

from .conftest import Harness

CHUNK = 12


def test_hooks_run_in_order_and_finish_exactly_once(async_scheduling: bool) -> None:
    h = Harness(async_scheduling=async_scheduling, device_blocks=30)
    prompt = h.tokens(3 * CHUNK)
    h.run(h.request("A", prompt + h.tokens(1)))
    h.run(*[h.request(f"f{i}", h.tokens(6 * CHUNK)) for i in range(3)])
    h.run(h.request("B", prompt + h.tokens(2 * CHUNK + 1)))
    for req_id in ("A", "B"):
        calls = h.manager.calls_for(req_id)
        assert calls[0] == "on_new_request"
        assert calls.count("on_new_request") == 1
        assert calls.count("on_request_finished") == 1
        assert calls[-1] == "on_request_finished"
        assert calls.index("lookup") < calls.index("prepare_store")
    assert "prepare_load" in h.manager.calls_for("B")
    assert h.connector.num_live_requests() == 0


def _fail_stores(job: TransferJob) -> bool:
    return job.direction is TransferDirection.STORE


@pytest.mark.parametrize("how", ["slow link", "failed stores", "abort", "reset"])
def test_the_manager_hears_a_request_finished_after_its_last_job(
    async_scheduling: bool, how: str
) -> None:
    """Scenario: on a slow host link, requests finish while their stores (and
    loads) are in flight; their stores fail, one is aborted mid-prompt, or the
    cache is reset with jobs in flight. As in the seed, the manager hears
    `on_request_finished` once the request's jobs have all completed: its last
    `complete_load`/`complete_store` comes before it, and nothing after it."""
    h = Harness(
        async_scheduling=async_scheduling,
        device_blocks=30,
        max_batched_tokens=2 * CHUNK if how == "abort" else 8192,
        time_model=TimeModel(transfer_bytes_per_s=2e6),
        fail_job=_fail_stores if how == "failed stores" else None,
    )
    prompt = h.tokens(3 * CHUNK)
    a = h.request("A", prompt + h.tokens(1))
    if how == "abort":
        h.engine.add([a])
        while not h.connector.has_pending_jobs():
            h.engine.step()
        h.engine.abort("A")
    elif how == "reset":
        h.engine.add([a])
        while not h.connector.has_pending_jobs():
            h.engine.step()
        h.connector.reset_cache()
    h.engine.run([] if how in ("abort", "reset") else [a])
    h.run(*[h.request(f"f{i}", h.tokens(6 * CHUNK)) for i in range(3)])
    h.run(h.request("B", prompt + h.tokens(2 * CHUNK + 1)))
    jobs = {"complete_load", "complete_store"}
    for req_id in ("A", "B", "f0"):
        calls = h.manager.calls_for(req_id)
        assert calls.count("on_request_finished") == 1, calls
        assert calls[-1] == "on_request_finished", calls
    if how == "slow link":
        # The request finished before its store completed (the case at issue).
        assert "complete_store" in h.manager.calls_for("A")
        assert "complete_load" in h.manager.calls_for("B")
    assert jobs & set(h.manager.calls_for("f0"))
    assert h.connector.num_live_requests() == 0


def test_preempted_requests_blocks_wait_for_their_stores(
    async_scheduling: bool,
) -> None:
    """Scenario: three long requests on a device of 36 blocks with a small token
    budget and a slow host link; growth preempts one while its chunks are being
    stored, and its blocks go to another request."""
    h = Harness(
        async_scheduling=async_scheduling,
        device_blocks=36,
        max_batched_tokens=16,
        time_model=TimeModel(transfer_bytes_per_s=2e6),
    )
    reqs = [
        h.request(f"r{i}", h.tokens(4 * CHUNK), output=h.tokens(30), arrival=0.0)
        for i in range(3)
    ]
    h.run(*reqs)
    assert any(r.preemptions for r in reqs)
    assert h.connector.waits(), "the worker was told to finish jobs before reuse"
    assert all(r.num_output == r.max_output_tokens for r in reqs)
    assert h.connector.num_live_requests() == 0
    assert not h.connector.has_pending_jobs()


def test_aborted_request_stores_only_what_it_computed(async_scheduling: bool) -> None:
    h = Harness(async_scheduling=async_scheduling, max_batched_tokens=CHUNK)
    req = h.request("long", h.tokens(10 * CHUNK))
    h.engine.add([req])
    for _ in range(4):
        h.engine.step()
    computed = req.num_computed
    assert 0 < computed < 10 * CHUNK
    h.engine.abort("long")
    h.engine.run()
    offered = h.manager.offered.get("long", [])
    assert 0 < len(offered) <= computed // CHUNK
    assert h.manager.calls_for("long").count("on_request_finished") == 1
    assert h.connector.num_live_requests() == 0
    assert req.first_token_time is None


def test_reset_mid_transfer_ignores_late_completions(async_scheduling: bool) -> None:
    h = Harness(async_scheduling=async_scheduling)
    prompt = h.tokens(3 * CHUNK)
    req = h.request("A", prompt + h.tokens(1))
    h.engine.add([req])
    while not h.connector.has_pending_jobs():
        h.engine.step()
    in_flight = {job.job_id for plan in h.connector.plans for job in plan.stores}
    h.connector.reset_cache()
    h.engine.run()
    assert in_flight <= set(h.connector.waits())
    ctx = ReqContext("probe")
    assert h.manager.lookup_prefix(h.manager.offered["A"], ctx).present == 0
    # The tier keeps working after the reset.
    b = h.request("B", h.tokens(2 * CHUNK + 1))
    h.run(b)
    assert all(
        h.manager.lookup(k, ctx) is LookupResult.HIT for k in h.manager.offered["B"]
    )


def test_reused_blocks_wait_for_the_stores_reading_them() -> None:
    """Scenario: A's store from engine blocks 0-5 is in flight when A finishes and
    the engine gives blocks 3 and 4 to B: the plan fences them; once the store
    completed, reusing them needs no wait."""
    hasher = BlockHasher(4)
    connector = OffloadConnector(
        ConnectorConfig((GroupSpec(4, 3),)), CPUOffloadingManager(8)
    )

    def sim(req_id: str, tokens: list[int]) -> SimRequest:
        return SimRequest(req_id, 0.0, len(tokens), 1, hasher.hash_blocks(tokens), 4)

    a = sim("A", list(range(24)))
    connector.on_new_request(a)
    assert connector.get_num_new_matched_tokens(a, 0) == 0
    connector.update_state_after_alloc("A", [list(range(6))], 0, 0)
    (store,) = connector.build_step([ScheduledRequest("A", 0, 24)]).stores
    connector.request_finished("A")
    b = sim("B", list(range(100, 124)))
    connector.on_new_request(b)
    assert connector.get_num_new_matched_tokens(b, 0) == 0
    connector.update_state_after_alloc("B", [[9, 3, 4]], 0, 0)
    plan = connector.build_step([ScheduledRequest("B", 0, 12)])
    assert plan.wait_for == (store.job_id,)
    connector.on_job_results([JobResult(store.job_id, True)])
    c = sim("C", list(range(200, 212)))
    connector.on_new_request(c)
    assert connector.get_num_new_matched_tokens(c, 0) == 0
    connector.update_state_after_alloc("C", [[0, 1]], 0, 0)
    assert connector.build_step([ScheduledRequest("C", 0, 8)]).wait_for == ()
    assert connector.num_live_requests() == 2


def test_a_request_whose_load_landed_waits_for_room_and_preempts_nothing(
    async_scheduling: bool,
) -> None:
    """Scenario: D repeats A's prompt, whose 3 chunks only the host still holds, and
    arrives just after B on a device of 15 blocks. D's load lands while B decodes,
    and the rest of D's prompt does not fit: D keeps its loaded blocks and waits for
    B to finish (vLLM admits a waiting request only into free memory)."""
    h = Harness(async_scheduling=async_scheduling, device_blocks=15)
    prompt = h.tokens(3 * CHUNK)
    h.run(h.request("A", prompt + h.tokens(1)))
    h.run(*[h.request(f"f{i}", h.tokens(52)) for i in range(2)])  # A off the device
    b = h.request("B", h.tokens(CHUNK), output=h.tokens(10))
    d = h.request("D", prompt + h.tokens(CHUNK + 1), arrival=h.clock.now + 0.001)
    h.run(b, d)
    assert (b.preemptions, d.preemptions) == (0, 0)
    assert d.loaded_tokens == 3 * CHUNK
    assert b.num_output == 10 and d.num_output == 2
    assert h.connector.num_live_requests() == 0
