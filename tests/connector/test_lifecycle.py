"""Hook order, preemption, abort and reset in the middle of transfers."""

from __future__ import annotations

from kvoffload import LookupResult, ReqContext

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
        after = calls[calls.index("on_request_finished") + 1 :]
        assert not {"lookup", "prepare_load", "prepare_store"} & set(after)
        assert calls.index("lookup") < calls.index("prepare_store")
    assert "prepare_load" in h.manager.calls_for("B")
    assert h.connector.num_live_requests() == 0


def test_preempted_requests_blocks_wait_for_their_stores(async_scheduling: bool) -> None:
    """Scenario: three long requests on a device of 36 blocks with a small token
    budget; growth preempts one while its chunks are being stored."""
    h = Harness(
        async_scheduling=async_scheduling, device_blocks=36, max_batched_tokens=16
    )
    reqs = [
        h.request(f"r{i}", h.tokens(4 * CHUNK), output=h.tokens(30), arrival=0.0) for i in range(3)
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
    assert all(h.manager.lookup(k, ctx) is LookupResult.HIT for k in h.manager.offered["B"])
