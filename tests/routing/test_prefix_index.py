"""The prefix index a KV-aware router embeds: what it learns from engines' events,
and how far it says each engine can serve a prefix."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvoffload.routing import PrefixIndex


def test_an_engine_serves_the_prefix_its_tiers_hold_until_the_last_tier_drops_it() -> (
    None
):
    index = PrefixIndex()
    index.on_stored("a", [1, 2, 3], "CPU")
    index.on_stored("a", [1, 2], "file")
    index.on_stored("b", [1], "CPU")
    found = index.match([1, 2, 3, 4])
    assert (found.local, found.shared) == ({"a": 3, "b": 1}, 0)
    index.on_removed("a", [2], "CPU")  # still on a's disk
    assert index.match([1, 2, 3]).local == {"a": 3, "b": 1}
    index.on_removed("a", [2], "file")  # gone: a's prefix ends before it
    assert index.match([1, 2, 3]).local == {"a": 1, "b": 1}
    index.on_cleared("a")
    assert index.match([1, 2, 3]).local == {"b": 1}


def test_what_any_engine_stores_in_a_shared_tier_every_engine_can_load() -> None:
    index = PrefixIndex(shared_tiers=["shared-redis"])
    index.on_stored("a", [1, 2], "shared-redis")
    index.on_stored("b", [1, 2, 3], "CPU")
    index.on_stored("c", [9], "CPU")
    found = index.match([1, 2, 3, 4])
    assert found.shared == 2
    assert found.local == {"b": 3}
    assert found.reach == {"b": 3}  # only where it beats the shared prefix
    assert found.reach_blocks("c") == 2 and found.local_blocks("c") == 0
    index.on_removed("b", [1], "shared-redis")  # any engine may see it go
    assert index.match([1, 2, 3]).shared == 0


@dataclass
class BlockStored:  # the fields of vLLM's event the index reads
    block_hashes: list[int]
    parent_block_hash: int | None
    medium: str | None
    ownership: str | None = None


@dataclass
class BlockRemoved:
    block_hashes: list[int]
    medium: str | None
    ownership: str | None = None


class AllBlocksCleared:
    pass


@dataclass
class Batch:
    events: list[object] = field(default_factory=list)


def test_event_batches_feed_it_as_the_calls_do() -> None:
    index = PrefixIndex(shared_tiers=["redis"])
    index.apply(
        "a",
        Batch(
            [
                BlockStored([1, 2], None, "GPU"),
                BlockStored([1, 2, 3], None, "CPU"),
                BlockStored([1, 2, 3, 4], None, "STORAGE", ownership="file"),
                BlockStored([7], None, "CPU", ownership="redis"),
                BlockRemoved([4], "STORAGE", ownership="file"),
            ]
        ),
    )
    assert index.match([1, 2, 3, 4]).local == {"a": 3}
    assert index.match([7]).shared == 1
    index.apply("a", Batch([AllBlocksCleared()]))
    assert index.match([1, 2, 3]).local == {}
    assert index.match([7]).shared == 1  # a shared tier is not a's to clear


def test_vllm_kv_event_batches_as_kvoffload_publishes_them() -> None:
    events = pytest.importorskip("vllm.distributed.kv_events")
    index = PrefixIndex(shared_tiers=["redis"])
    stored = events.BlockStored(
        block_hashes=[11, 12], parent_block_hash=None, token_ids=[0] * 32,
        block_size=16, lora_id=None, medium="CPU", lora_name=None,
    )  # fmt: skip
    shared = events.BlockStored(
        block_hashes=[11, 12, 13], parent_block_hash=None, token_ids=[0] * 48,
        block_size=16, lora_id=None, medium="CPU", lora_name=None, ownership="redis",
    )  # fmt: skip
    removed = events.BlockRemoved(block_hashes=[12], medium="CPU")
    index.apply(0, events.KVEventBatch(ts=0.0, events=[stored, shared]))
    found = index.match([11, 12, 13])
    assert (found.shared, found.local) == (3, {0: 2})
    index.apply(0, events.KVEventBatch(ts=1.0, events=[removed]))
    assert index.match([11, 12, 13]).local == {0: 1}
    index.apply(0, events.KVEventBatch(ts=2.0, events=[events.AllBlocksCleared()]))
    assert index.match([11]).local == {}


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]),
            st.sampled_from(["CPU", "file", "shared"]),
            st.booleans(),
            st.lists(st.integers(0, 7), max_size=4),
        ),
        max_size=40,
    ),
    st.lists(st.integers(0, 7), max_size=6),
)
def test_matches_agree_with_a_plain_model(
    ops: list[tuple[str, str, bool, list[int]]], request: list[int]
) -> None:
    """Against sets per (engine, tier): the depths are the leading blocks held."""
    index = PrefixIndex(shared_tiers=["shared"])
    held: dict[tuple[str, str], set[int]] = {}
    for engine, tier, removed, hashes in ops:
        owner = "*" if tier == "shared" else engine
        place = held.setdefault((owner, tier), set())
        if removed:
            index.on_removed(engine, hashes, tier)
            place.difference_update(hashes)
        else:
            index.on_stored(engine, hashes, tier)
            place.update(hashes)

    def depth(has: set[int]) -> int:
        n = 0
        while n < len(request) and request[n] in has:
            n += 1
        return n

    shared = set().union(*(v for (o, _), v in held.items() if o == "*"))
    found = index.match(request)
    assert found.shared == depth(shared)
    for engine in index.engines():
        own = set().union(*(v for (o, _), v in held.items() if o == engine))
        assert found.local_blocks(engine) == depth(own)
        assert found.reach_blocks(engine) == depth(own | shared)
