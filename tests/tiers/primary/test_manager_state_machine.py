"""Random call sequences against a reference model of the primary tier.

Checked after every step: capacity never exceeded; pinned, in-flight and offered
chunks never evicted; a `None` from prepare_store changes nothing; every stored
chunk is readable unless reported evicted; only failed stores count as failures
(an aborted one, a failed promotion, does not); a slot that a reset was told is
still being copied is handed out to no store until released; once every load
completed and every held slot was released, the whole pool can be stored into.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvoffload import (
    CPUOffloadingManager,
    LookupResult,
    OffloadKey,
    ReqContext,
    make_offload_key,
)
from kvoffload.policies import policy_names

CAPACITY = 6
CTX = ReqContext("sm")


def k(i: int) -> OffloadKey:
    return make_offload_key(i.to_bytes(8, "big"), 0)


class ManagerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.m: CPUOffloadingManager | None = None
        self.readable: set[OffloadKey] = set()
        self.writing: list[tuple[OffloadKey, ...]] = []
        self.pins: list[tuple[OffloadKey, ...]] = []
        self.slot_of: dict[OffloadKey, int] = {}
        # Per job in flight at a reset: the slots it still copies.
        self.held: list[tuple[int, ...]] = []
        self.failures = 0

    @property
    def manager(self) -> CPUOffloadingManager:
        assert self.m is not None
        return self.m

    @precondition(lambda self: self.m is None)
    @rule(policy=st.sampled_from(policy_names()), threshold=st.sampled_from([0, 2]))
    def create(self, policy: str, threshold: int) -> None:
        self.m = CPUOffloadingManager(CAPACITY, policy, store_threshold=threshold)

    def _pinned(self) -> set[OffloadKey]:
        return {key for job in self.pins for key in job}

    def _in_flight(self) -> set[OffloadKey]:
        return {key for job in self.writing for key in job}

    @precondition(lambda self: self.m is not None)
    @rule(ids=st.lists(st.integers(0, 15), min_size=1, max_size=4))
    def prepare_store(self, ids: list[int]) -> None:
        offered = [k(i) for i in ids]
        self.manager.lookup_prefix(offered, CTX)
        protected = self._pinned() | self._in_flight() | set(offered)
        before = {key: self.manager.lookup(key, CTX) for key in map(k, range(16))}
        out = self.manager.prepare_store(offered, CTX)
        if out is None:
            after = {key: self.manager.lookup(key, CTX) for key in map(k, range(16))}
            assert after == before, "a failed prepare_store changed the tier"
            return
        assert not set(out.evicted_keys) & protected
        assert set(out.keys_to_store) <= set(offered)
        assert not set(out.keys_to_store) & (self.readable | self._in_flight())
        held = {slot for job in self.held for slot in job}
        assert not set(out.slots) & held, "a held slot was handed out"
        self.slot_of.update(zip(out.keys_to_store, out.slots, strict=True))
        self.readable -= set(out.evicted_keys)
        if out.keys_to_store:
            self.writing.append(out.keys_to_store)

    @precondition(lambda self: self.m is not None and self.writing)
    @rule(
        index=st.integers(0, 10),
        outcome=st.sampled_from(["stored", "failed", "aborted"]),
    )
    def complete_store(self, index: int, outcome: str) -> None:
        job = self.writing.pop(index % len(self.writing))
        if outcome == "aborted":
            self.manager.abort_store(job)
            return
        self.manager.complete_store(job, CTX, success=outcome == "stored")
        if outcome == "stored":
            self.readable |= set(job)
        else:
            self.failures += len(job)

    @precondition(lambda self: self.m is not None and self.readable)
    @rule(data=st.data())
    def prepare_load(self, data: st.DataObject) -> None:
        job = tuple(
            data.draw(st.lists(st.sampled_from(sorted(self.readable)), max_size=3))
        )
        slots = self.manager.prepare_load(job, CTX)
        assert len(slots) == len(job)
        self.pins.append(job)

    @precondition(lambda self: self.m is not None and self.pins)
    @rule(index=st.integers(0, 10))
    def complete_load(self, index: int) -> None:
        self.manager.complete_load(self.pins.pop(index % len(self.pins)), CTX)

    @precondition(lambda self: self.m is not None)
    @rule()
    def reset(self) -> None:
        """Every job in flight keeps copying its slots after the reset."""
        jobs = [*self.writing, *self.pins]
        busy = [tuple(self.slot_of[key] for key in job) for job in jobs]
        self.manager.reset_cache([slot for job in busy for slot in job])
        self.held += busy
        self.readable.clear()
        self.writing.clear()
        self.pins.clear()

    @precondition(lambda self: self.m is not None and self.held)
    @rule(index=st.integers(0, 10))
    def release(self, index: int) -> None:
        self.manager.release_slots(self.held.pop(index % len(self.held)))

    @precondition(lambda self: self.m is not None)
    @rule(ids=st.lists(st.integers(0, 15), max_size=5))
    def touch(self, ids: list[int]) -> None:
        self.manager.touch([k(i) for i in ids], CTX)

    @invariant()
    def model_agrees(self) -> None:
        if self.m is None:
            return
        stats = self.manager.get_stats()["cpu"]
        assert stats.occupancy <= CAPACITY
        for key in self.readable:
            assert self.manager.lookup(key, CTX) is LookupResult.HIT
        for key in self._in_flight():
            assert self.manager.lookup(key, CTX) is LookupResult.HIT_PENDING
        assert stats.occupancy == len(self.readable) + len(self._in_flight())
        assert stats.failures == self.failures

    def teardown(self) -> None:
        if self.m is None:
            return
        # Once every load and store completed, nothing is pinned: the whole pool
        # can be evicted for new chunks.
        for job in self.pins:
            self.manager.complete_load(job, CTX)
        for job in self.writing:
            self.manager.complete_store(job, CTX)
        for slots in self.held:
            self.manager.release_slots(slots)
        fresh = [k(100 + i) for i in range(CAPACITY)]
        for req in ("drain-1", "drain-2"):  # pass the reuse filter, if any
            self.manager.lookup_prefix(fresh, ReqContext(req))
        out = self.manager.prepare_store(fresh, ReqContext("drain-2"))
        assert out is not None and len(out.keys_to_store) == CAPACITY


ManagerMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
test_manager_state_machine = ManagerMachine.TestCase
