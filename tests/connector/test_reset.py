"""reset_cache with device copies in flight: the host slots they write or read
are reused by nothing, promotions included, until every rank has reported them,
and their loads are reported failed.

The test plays the engine and its workers: a device copy "lands" when the test
writes its bytes into the host buffer, which the tiers share.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvoffload import CPUOffloadingManager, OffloadKey
from kvoffload.connector import (
    ConnectorConfig,
    GroupSpec,
    OffloadConnector,
    ScheduledRequest,
)
from kvoffload.engine_model import SimClock, SimRequest
from kvoffload.keys import BlockHasher, chunk_keys
from kvoffload.tiering import TieringManager
from kvoffload.tiers.secondary import ArrayChunkBuffer
from kvoffload.worker.base import JobResult, TransferJob
from tests.tiering.tiering_support import SLOT, HeldTier, payload

CHUNK = 4  # tokens: one engine block of 4 tokens per chunk
NO_CASCADE: dict[str, Any] = {"kv_store_tiers": []}


@dataclass
class Stack:
    """A connector over a one-slot host tier and a scripted disk tier (the
    in-memory `HeldTier`, whose promotions land when released)."""

    world_size: int = 1
    clock: SimClock = field(default_factory=SimClock)

    def __post_init__(self) -> None:
        self.buffer = ArrayChunkBuffer(1, SLOT)
        self.disk = HeldTier(self.buffer, auto=False)
        self.manager = TieringManager(
            CPUOffloadingManager(1), [self.disk], clock=self.clock
        )
        config = ConnectorConfig((GroupSpec(CHUNK, 1),), world_size=self.world_size)
        self.connector = OffloadConnector(config, self.manager, clock=self.clock)
        self._next_block = 1

    def request(
        self, req_id: str, first_token: int, params: dict[str, Any] | None = None
    ) -> SimRequest:
        """One whole chunk and a last token."""
        tokens = list(range(first_token, first_token + CHUNK + 1))
        hashes = BlockHasher(CHUNK).hash_blocks(tokens)
        req = SimRequest(req_id, 0.0, len(tokens), 1, hashes, CHUNK, params)
        self.connector.on_new_request(req)
        return req

    @staticmethod
    def key(req: SimRequest) -> OffloadKey:
        return chunk_keys(list(req.hashes), 1, 0)[0]

    def _blocks(self) -> list[int]:
        blocks = [self._next_block, self._next_block + 1]
        self._next_block += 2
        return blocks

    def store(self, req: SimRequest) -> TransferJob:
        """Compute the request's prompt: its chunk's store job, handed out."""
        assert self.connector.get_num_new_matched_tokens(req, 0) == 0
        self.connector.update_state_after_alloc(req.request_id, [self._blocks()], 0, 0)
        scheduled = ScheduledRequest(req.request_id, 0, req.num_prompt_tokens)
        (job,) = self.connector.build_step([scheduled]).stores
        return job

    def load(self, req: SimRequest, tokens: int) -> TransferJob:
        """Allocate the request's blocks: its load job, handed out."""
        self.connector.update_state_after_alloc(
            req.request_id, [self._blocks()], 0, tokens
        )
        (job,) = self.connector.build_step([]).loads
        return job

    def land(self, store: TransferJob, key: OffloadKey) -> None:
        """A store's device copy writes `key`'s bytes into its host slot."""
        for slot in store.groups[0].host_blocks:
            self.buffer.slot_view(slot)[:] = payload(key, SLOT)

    def read(self, load: TransferJob) -> bytes:
        """What a load's device copy reads from its host slot now."""
        (slot,) = load.groups[0].host_blocks
        return bytes(self.buffer.slot_view(slot))

    def report(self, job: TransferJob, *ranks: int) -> None:
        for rank in ranks:
            self.connector.on_job_results([JobResult(job.job_id, True)], rank)

    def step(self) -> None:
        """The disk tier's I/O ends; the scheduler step folds it in."""
        self.disk.release()
        self.manager.on_schedule_end()

    def look_up_until_readable(self, req: SimRequest) -> int | None:
        for _ in range(5):
            found = self.connector.get_num_new_matched_tokens(req, 0)
            if found:
                return found
            self.step()
        return found

    def stored_elsewhere(self, req: SimRequest) -> None:
        """Another engine sharing the disk tier stored the request's chunk."""
        self.disk.chunks[self.key(req)] = payload(self.key(req), SLOT)


def _promote_past_a_stale_store(
    stack: Stack, early_ranks: tuple[int, ...], late_ranks: tuple[int, ...]
) -> tuple[TransferJob, TransferJob, bytes]:
    """A's store into the only host slot is in flight at a reset; the ranks in
    `early_ranks` report it. B's chunk, stored on disk by another engine since,
    is looked up (a promotion into host memory may start and land). Only then
    does the store's copy land on the other ranks and they report it. B then
    looks up until its chunk is readable and loads it: (A's store, B's load,
    B's bytes)."""
    a = stack.request("A", 0, NO_CASCADE)
    store = stack.store(a)
    stack.connector.reset_cache()
    b = stack.request("B", 100)
    stack.stored_elsewhere(b)
    stack.report(store, *early_ranks)
    stack.connector.get_num_new_matched_tokens(b, 0)
    stack.step()
    stack.land(store, stack.key(a))
    stack.report(store, *late_ranks)
    assert stack.look_up_until_readable(b) == CHUNK
    return store, stack.load(b, CHUNK), payload(stack.key(b), SLOT)


def test_a_store_in_flight_at_reset_keeps_its_slot_from_a_promotion() -> None:
    """Scenario: A's store into the only host slot is in flight when the cache
    resets, and B's chunk, which another engine has stored on disk since, is
    looked up. Promoting it into A's slot before A's store is reported would
    let A's late device copy overwrite it: B would load A's KV. Once A's store
    is reported, the slot is free again and serves B's promotion."""
    stack = Stack()
    store, load, expected = _promote_past_a_stale_store(stack, (), (0,))
    assert stack.read(load) == expected, "B's chunk was overwritten by A's"
    assert load.groups[0].host_blocks == store.groups[0].host_blocks


def test_with_two_ranks_the_slot_is_held_until_both_have_reported() -> None:
    """Scenario: as above with two worker ranks: rank 0 reports A's store before
    B's lookup, rank 1's copy is still running then. The slot stays held until
    rank 1 has reported too."""
    stack = Stack(world_size=2)
    store, load, expected = _promote_past_a_stale_store(stack, (0,), (1,))
    assert stack.read(load) == expected, "B's chunk was overwritten by A's"
    assert load.groups[0].host_blocks == store.groups[0].host_blocks


def test_a_load_in_flight_at_reset_keeps_its_slot_and_is_reported_failed() -> None:
    """Scenario: W stored a chunk; L's load of it is in flight when the cache
    resets, and B's chunk, stored on disk by another engine since, is looked
    up. L's copy must still read W's bytes, not a promotion's; L's load is
    reported failed all the same (the reset dropped its chunk, maybe KV of old
    weights), to the engine and in the next plan for the workers. The slot then
    serves B."""
    stack = Stack()
    w = stack.request("W", 0, NO_CASCADE)
    store = stack.store(w)
    stack.land(store, stack.key(w))
    stack.report(store, 0)
    reader = stack.request("L", 0)
    assert stack.connector.get_num_new_matched_tokens(reader, 0) == CHUNK
    load = stack.load(reader, CHUNK)
    stack.connector.reset_cache()
    b = stack.request("B", 100)
    stack.stored_elsewhere(b)
    stack.connector.get_num_new_matched_tokens(b, 0)
    stack.step()
    assert stack.read(load) == payload(stack.key(w), SLOT)
    assert stack.connector.build_step([]).stale_loads == (load.job_id,)
    stack.report(load, 0)
    assert stack.connector.take_load_results() == ([], ["L"])
    assert stack.look_up_until_readable(b) == CHUNK
    assert stack.read(stack.load(b, CHUNK)) == payload(stack.key(b), SLOT)


def test_a_load_planned_but_not_handed_out_at_reset_copies_nothing() -> None:
    """Scenario: L's load is planned when the cache resets, before the step
    hands it out: it goes to the workers marked to fail, copying nothing, and
    L recomputes."""
    stack = Stack()
    w = stack.request("W", 0, NO_CASCADE)
    store = stack.store(w)
    stack.report(store, 0)
    reader = stack.request("L", 0)
    assert stack.connector.get_num_new_matched_tokens(reader, 0) == CHUNK
    stack.connector.update_state_after_alloc("L", [[7, 8]], 0, CHUNK)
    stack.connector.reset_cache()
    plan = stack.connector.build_step([])
    (load,) = plan.loads
    assert load.fail and load.num_blocks == 0
    assert plan.stale_loads == ()
    stack.connector.on_job_results([JobResult(load.job_id, False)])
    assert stack.connector.take_load_results() == ([], ["L"])
