"""Random call sequences through a TieringManager with a scripted and a memory tier.

Checked throughout: every chunk the engine loads has exactly the bytes it wrote;
a secondary tier never holds wrong bytes; lookups never RETRY (no asynchronous
tier here). Checked at the end, after letting every job finish: nothing stays
pinned or in flight (the whole primary tier can be rewritten), and each finished
request was forwarded to the tiers exactly once.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from kvoffload import LookupResult, OffloadKey, OffloadPolicy, ReqContext
from kvoffload.tiering import TieringManager
from kvoffload.tiers.secondary import ArrayChunkBuffer, MemoryTier, MemoryTierConfig
from tests.tiering.tiering_support import (
    SLOT,
    Engine,
    HeldTier,
    key,
    make_manager,
    payload,
)

CAPACITY = 6
SELECTORS = [None, ["held"], ["memory"], ["storage"], []]


class TieringMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.m: TieringManager | None = None
        self.engine: Engine | None = None
        self.held: HeldTier | None = None
        self.requests: dict[str, ReqContext] = {}
        self.finished: set[str] = set()
        self.writing: list[tuple[tuple[OffloadKey, ...], ReqContext]] = []

    @property
    def manager(self) -> TieringManager:
        assert self.m is not None
        return self.m

    @precondition(lambda self: self.m is None)
    @rule(
        whole=st.booleans(),
        inflight=st.integers(1, 4),
        threshold=st.sampled_from([0, 2]),
    )
    def create(self, whole: bool, inflight: int, threshold: int) -> None:
        buf = ArrayChunkBuffer(CAPACITY, SLOT)
        policy = OffloadPolicy.REQUEST_LEVEL if whole else OffloadPolicy.CHUNK_LEVEL
        self.held = HeldTier(
            buf, policy=policy, auto=False, max_inflight_chunks=inflight
        )
        memory = MemoryTier(MemoryTierConfig(4), buf)
        self.m, self.engine = make_manager(
            [self.held, memory],
            num_chunks=CAPACITY,
            buffer=buf,
            store_threshold=threshold,
        )

    @precondition(lambda self: self.m is not None)
    @rule(
        n=st.integers(0, 2),
        load=st.sampled_from(SELECTORS),
        store=st.sampled_from(SELECTORS),
    )
    def new_request(
        self, n: int, load: list[str] | None, store: list[str] | None
    ) -> None:
        rid = f"r{n}"
        if rid in self.requests:
            return
        params = {"kv_load_tiers": load, "kv_store_tiers": store}
        ctx = ReqContext.create(rid, params)
        self.requests[rid] = ctx
        self.manager.on_new_request(ctx)

    def _ctx(self, n: int) -> ReqContext | None:
        ctx = self.requests.get(f"r{n}")
        return None if ctx is None or ctx.req_id in self.finished else ctx

    @precondition(lambda self: self.m is not None)
    @rule(
        n=st.integers(0, 2),
        ids=st.lists(st.integers(0, 7), min_size=1, max_size=3),
        now=st.booleans(),
    )
    def store(self, n: int, ids: list[int], now: bool) -> None:
        ctx = self._ctx(n)
        if ctx is None:
            return
        ks = [key(i) for i in ids]
        self.manager.lookup_prefix(ks, ctx)
        out = self.manager.prepare_store(ks, ctx)
        if out is None or not out.keys_to_store:
            return
        assert self.engine is not None
        for k, slot in zip(out.keys_to_store, out.slots, strict=True):
            self.engine.buffer.slot_view(slot)[:] = payload(k, SLOT)
        if now:
            self.manager.complete_store(out.keys_to_store, ctx)
        else:
            self.writing.append((out.keys_to_store, ctx))

    @precondition(lambda self: self.writing)
    @rule(index=st.integers(0, 10), success=st.booleans())
    def complete_write(self, index: int, success: bool) -> None:
        ks, ctx = self.writing.pop(index % len(self.writing))
        self.manager.complete_store(ks, ctx, success)

    @precondition(lambda self: self.m is not None)
    @rule(n=st.integers(0, 2), ids=st.lists(st.integers(0, 7), min_size=1, max_size=4))
    def lookup_and_load(self, n: int, ids: list[int]) -> None:
        ctx = self._ctx(n)
        if ctx is None:
            return
        ks = [key(i) for i in ids]
        found = self.manager.lookup_prefix(ks, ctx)
        assert not found.retry
        if found.ready:
            assert self.engine is not None
            self.engine.load(ks[: found.ready], ctx)  # checks the bytes

    @precondition(lambda self: self.held is not None)
    @rule(n=st.integers(0, 3), fail_stores=st.booleans(), fail_loads=st.booleans())
    def tier_progress(self, n: int, fail_stores: bool, fail_loads: bool) -> None:
        assert self.held is not None
        self.held.fail_stores, self.held.fail_loads = fail_stores, fail_loads
        self.held.release(n)
        for k, data in self.held.chunks.items():
            assert data == payload(k, SLOT), "a tier holds wrong bytes"

    @precondition(lambda self: self.m is not None)
    @rule()
    def step(self) -> None:
        self.manager.on_schedule_end()

    @precondition(lambda self: self.m is not None)
    @rule(n=st.integers(0, 2))
    def finish(self, n: int) -> None:
        ctx = self._ctx(n)
        if ctx is None:
            return
        self.finished.add(ctx.req_id)
        self.manager.on_request_finished(ctx)

    @precondition(lambda self: self.m is not None)
    @rule()
    def reset(self) -> None:
        self.manager.reset_cache()

    def teardown(self) -> None:
        if self.m is None or self.held is None:
            return
        for ks, ctx in self.writing:
            self.m.complete_store(ks, ctx)
        self.held.fail_stores = self.held.fail_loads = False
        for _ in range(4):
            self.held.release()
            self.m.on_schedule_end()
        assert not self.m.has_pending_work()
        for rid in self.finished:
            assert self.held.calls.count(("finished", rid)) == 1
        fresh, other = ReqContext("fresh"), ReqContext("other")
        new_keys = [key(100 + i) for i in range(CAPACITY)]
        for ctx in (other, fresh):  # two requests pass any reuse filter
            self.m.on_new_request(ctx)
            self.m.lookup_prefix(new_keys, ctx)
        out = self.m.prepare_store(new_keys, fresh)
        assert out is not None and len(out.keys_to_store) == CAPACITY, "a slot leaked"
        assert self.m.lookup(key(1000), fresh) is LookupResult.MISS
        self.m.shutdown()


TestTieringMachine = TieringMachine.TestCase
TestTieringMachine.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
