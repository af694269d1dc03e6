"""Random call sequences against a reference model of the file tier's index,
with chunk files of mixed sizes (groups of different chunk sizes).

Checked on every reservation: it succeeds exactly when evicting every readable,
unpinned chunk would make room; a failed one evicts nothing and changes nothing;
a successful one evicts only readable, unpinned chunks, and none beyond need.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvoffload import OffloadKey, make_offload_key
from kvoffload.policies import create_policy, policy_names
from kvoffload.tiers.secondary.file_index import FileIndex, Reservation

CAPACITY = 12
SIZES = (2, 3, 5)
NUM_KEYS = 10


def k(i: int) -> OffloadKey:
    return make_offload_key(i.to_bytes(8, "big"), 0)


class FileIndexMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.index: FileIndex | None = None
        self.sizes: dict[OffloadKey, int] = {}
        self.writing: set[OffloadKey] = set()
        self.pins: dict[OffloadKey, int] = {}

    @property
    def idx(self) -> FileIndex:
        assert self.index is not None
        return self.index

    def _evictable(self) -> set[OffloadKey]:
        return {
            key
            for key in self.sizes
            if key not in self.writing and not self.pins.get(key)
        }

    def _readable(self) -> set[OffloadKey]:
        return set(self.sizes) - self.writing

    @precondition(lambda self: self.index is None)
    @rule(policy=st.sampled_from(policy_names()))
    def create(self, policy: str) -> None:
        self.index = FileIndex(CAPACITY, create_policy(policy, CAPACITY))

    @precondition(lambda self: self.index is not None)
    @rule(i=st.integers(0, NUM_KEYS - 1), size=st.sampled_from(SIZES))
    def reserve(self, i: int, size: int) -> None:
        key = k(i)
        if key in self.sizes:
            return
        evictable = self._evictable()
        deficit = sum(self.sizes.values()) + size - CAPACITY
        expected = deficit <= sum(self.sizes[v] for v in evictable)
        before = (self.idx.used_bytes, self._readable())
        got = self.idx.reserve(key, size)
        assert got.ok == expected
        if not got.ok:
            assert got.victims == [], "a failed reservation evicted chunks"
            assert self.idx.used_bytes == before[0]
            assert all(self.idx.is_readable(r) for r in before[1])
            return
        assert set(got.victims) <= evictable
        assert len(set(got.victims)) == len(got.victims)
        freed = [self.sizes.pop(v) for v in got.victims]
        assert sum(freed) >= deficit
        if freed:
            assert sum(freed) - freed[-1] < deficit, "evicted beyond need"
        self.idx.deleted(got.victims)
        self.sizes[key] = size
        self.writing.add(key)

    @precondition(lambda self: self.writing)
    @rule(pick=st.integers(0, NUM_KEYS), success=st.booleans())
    def commit(self, pick: int, success: bool) -> None:
        key = sorted(self.writing)[pick % len(self.writing)]
        self.idx.commit(key, success)
        self.writing.discard(key)
        if not success:
            del self.sizes[key]

    @precondition(lambda self: self._readable())
    @rule(pick=st.integers(0, NUM_KEYS))
    def pin(self, pick: int) -> None:
        readable = sorted(self._readable())
        key = readable[pick % len(readable)]
        self.idx.pin(key)
        self.pins[key] = self.pins.get(key, 0) + 1

    @precondition(lambda self: self.pins)
    @rule(pick=st.integers(0, NUM_KEYS))
    def unpin(self, pick: int) -> None:
        key = sorted(self.pins)[pick % len(self.pins)]
        self.idx.unpin(key)
        self.pins[key] -= 1
        if not self.pins[key]:
            del self.pins[key]

    @precondition(lambda self: self._readable())
    @rule(pick=st.integers(0, NUM_KEYS))
    def forget(self, pick: int) -> None:
        """A file found bad or gone: dropped even while a load holds its pin."""
        readable = sorted(self._readable())
        key = readable[pick % len(readable)]
        assert self.idx.forget(key)
        del self.sizes[key]

    @invariant()
    def matches_the_model(self) -> None:
        if self.index is None:
            return
        assert self.idx.used_bytes == sum(self.sizes.values()) <= CAPACITY
        for i in range(NUM_KEYS):
            key = k(i)
            assert self.idx.is_readable(key) == (key in self._readable())


TestFileIndexMachine = FileIndexMachine.TestCase
TestFileIndexMachine.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)


def test_clear_forgets_chunks_but_a_key_being_deleted_stays_unwritable() -> None:
    """Scenario: chunk 1 was evicted for chunk 2 and its file is still being
    deleted when the tier resets. Chunk 2 is forgotten and its room is free;
    chunk 1 may not be written again until its delete has ended, or the late
    delete would remove the new file."""
    index = FileIndex(100, create_policy("lru", 1))
    assert index.add_existing(k(1), 100).ok
    reservation = index.reserve(k(2), 100)
    assert reservation.victims == [k(1)]
    index.commit(k(2), True)
    assert index.clear() == [k(2)]
    assert not index.is_known(k(2)) and index.used_bytes == 0
    assert index.is_known(k(1))  # still being deleted
    index.deleted([k(1)])
    assert not index.is_known(k(1))
    assert index.reserve(k(1), 100).ok
    # The reset left nothing evictable: with chunk 1 still being written there
    # is no room for another chunk, and the reservation says so.
    assert index.reserve(k(3), 100) == Reservation(False, [])
