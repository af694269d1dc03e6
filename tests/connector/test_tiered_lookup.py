"""Lookups over a tiering manager: what a lookup counts is still there to load."""

from __future__ import annotations

from kvoffload import CPUOffloadingManager, ReqContext, make_offload_key
from kvoffload.connector import ConnectorConfig, GroupSpec, OffloadConnector
from kvoffload.engine_model import SimClock, SimRequest
from kvoffload.keys import BlockHasher, chunk_keys
from kvoffload.tiering import TieringManager
from kvoffload.tiers.secondary import ArrayChunkBuffer
from kvoffload.worker.base import JobResult
from tests.tiering.tiering_support import SLOT, HeldTier, payload


def test_a_hybrid_lookup_past_its_deferral_loads_what_it_counted() -> None:
    """Scenario: two groups (sliding window and full attention) over a host tier
    and a disk tier. Group 0's chunks 0-1 are in host memory, and group 1's
    chunk 0; its chunk 1, also on disk, is being written to host memory by
    another request, so the lookup defers. That write fails and host memory
    fills up. Past its deferral bound the request proceeds: promoting group 1's
    chunk 1 from disk must not evict group 0's chunk 0 (the oldest), which the
    same lookup counted, or planning the load pins a chunk that is gone (an
    assertion on vLLM's scheduler thread)."""
    clock = SimClock()
    buf = ArrayChunkBuffer(5, SLOT)
    disk = HeldTier(buf, auto=False)
    host = CPUOffloadingManager(4)
    manager = TieringManager(host, [disk], clock=clock)
    config = ConnectorConfig((GroupSpec(4, 1), GroupSpec(4, 1)), max_defer_s=0.5)
    connector = OffloadConnector(config, manager, clock=clock)
    tokens = list(range(9))  # two whole chunks and one token
    hashes = BlockHasher(4).hash_blocks(tokens)
    (a0, a1), (b0, b1) = chunk_keys(hashes, 1, 0), chunk_keys(hashes, 1, 1)
    disk.chunks[b1] = payload(b1, SLOT)
    other = ReqContext.create("other", {"kv_store_tiers": []})  # no cascades
    manager.on_new_request(other)
    stored = manager.prepare_store([a0, a1, b0], other)
    assert stored is not None
    manager.complete_store(stored.keys_to_store, other)
    writing = manager.prepare_store([b1], other)
    assert writing is not None
    req = SimRequest("R", 0.0, len(tokens), 1, hashes, 4)
    connector.on_new_request(req)
    assert connector.get_num_new_matched_tokens(req, 0) is None

    manager.complete_store(writing.keys_to_store, other, success=False)
    filler = manager.prepare_store([make_offload_key(b"f" * 32, 0)], other)
    assert filler is not None and host.num_free_slots() == 0
    manager.complete_store(filler.keys_to_store, other)
    manager.on_schedule_end()
    clock.now = 1.0  # past the deferral bound

    assert connector.get_num_new_matched_tokens(req, 0) == 4
    assert host.is_readable(a0)
    connector.update_state_after_alloc("R", [[1, 2, 3], [4, 5, 6]], 0, 4)
    (load,) = connector.build_step([]).loads
    assert not load.fail
    connector.on_job_results([JobResult(load.job_id, True)])
    assert connector.take_load_results() == (["R"], [])
