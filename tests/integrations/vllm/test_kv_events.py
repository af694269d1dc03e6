"""KV events from real vLLM (CPU platform), read as a KV-aware router reads them.

vLLM publishes its events over ZMQ; the test subscribes like a router and keeps an
index: which block hashes each medium holds. Offloaded chunks must be announced in
vLLM's own block hashes (the ones its device-block events use), with tokens and
parents, and removed when they leave a tier.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kvoffload.integrations.vllm.model_builder import BuiltModel

from .conftest import LLMFactory
from .test_connector_e2e import BLOCK, DEVICE, A, evict, kv_config, run

pytestmark = pytest.mark.vllm


@dataclass
class Router:
    """Subscribes to an engine's KV events and indexes them by medium."""

    socket: Any
    endpoint: str
    stored: list[Any] = field(default_factory=list)
    removed: list[Any] = field(default_factory=list)
    index: dict[str, set[Any]] = field(default_factory=dict)
    removed_unknown: list[Any] = field(default_factory=list)

    def events_config(self) -> dict[str, Any]:
        return {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": self.endpoint,
        }

    def drain(self) -> None:
        import msgspec
        from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch

        decoder = msgspec.msgpack.Decoder(KVEventBatch)
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < 1.0:
            if not self.socket.poll(100):
                continue
            quiet_since = time.monotonic()
            batch = decoder.decode(self.socket.recv_multipart()[-1])
            for event in batch.events:
                held = self.index.setdefault(event.medium, set())
                if isinstance(event, BlockStored):
                    self.stored.append(event)
                    held.update(event.block_hashes)
                elif isinstance(event, BlockRemoved):
                    self.removed.append(event)
                    self.removed_unknown += [
                        h for h in event.block_hashes if h not in held
                    ]
                    held.difference_update(event.block_hashes)

    def stored_on(self, medium: str) -> list[Any]:
        return [e for e in self.stored if e.medium == medium]


@pytest.fixture
def router(tmp_path: Path) -> Iterator[Router]:
    zmq = pytest.importorskip("zmq")
    endpoint = f"ipc://{tmp_path}/events-{uuid.uuid4().hex[:8]}"
    socket = zmq.Context.instance().socket(zmq.SUB)
    socket.connect(endpoint)  # before the engine binds: no event is missed
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    yield Router(socket, endpoint)
    socket.close(linger=0)


def device_hashes(router: Router, tokens: list[int]) -> list[Any]:
    """The block hashes vLLM announced for the device blocks holding `tokens`."""
    by_tokens = {
        tuple(e.token_ids[i * e.block_size : (i + 1) * e.block_size]): h
        for e in router.stored_on("GPU")
        for i, h in enumerate(e.block_hashes)
    }
    whole = len(tokens) // BLOCK
    return [by_tokens[tuple(tokens[i * BLOCK : (i + 1) * BLOCK])] for i in range(whole)]


def test_offloaded_chunks_are_announced_in_vllm_block_hashes(
    llm_factory: LLMFactory, tiny_model: BuiltModel, router: Router
) -> None:
    llm = llm_factory(
        **tiny_model.vllm_args(),
        **DEVICE,
        kv_transfer_config=kv_config(),
        kv_events_config=router.events_config(),
    )
    run(llm, A)
    evict(llm)
    again = run(llm, A)
    assert again.num_cached_tokens == 2 * BLOCK, "A came back from host memory"
    router.drain()

    tokens = list(again.prompt_token_ids)
    gpu = device_hashes(router, tokens)
    assert len(gpu) == 2
    host = {e.block_hashes[0]: e for e in router.stored_on("CPU")}
    # The router finds A's offloaded chunks under the hashes of its device blocks,
    # with the tokens, the parent and the group a router needs to index them.
    first, second = host[gpu[0]], host[gpu[1]]
    assert first.parent_block_hash is None
    assert second.parent_block_hash == gpu[0]
    assert first.token_ids == tokens[:BLOCK]
    assert second.token_ids == tokens[BLOCK : 2 * BLOCK]
    assert (first.block_size, first.group_idx) == (BLOCK, 0)
    assert first.kv_cache_spec_kind == "full_attention"
    assert {gpu[0], gpu[1]} <= router.index["CPU"]
    # Every chunk any request stored is announced under a hash vLLM also used
    # for a device block.
    on_device = {h for e in router.stored_on("GPU") for h in e.block_hashes}
    assert set(host) <= on_device


def test_host_evictions_are_announced_as_removed(
    llm_factory: LLMFactory, tiny_model: BuiltModel, router: Router
) -> None:
    llm = llm_factory(
        **tiny_model.vllm_args(),
        **DEVICE,
        # 8 chunks of host memory: the fillers push A's chunks out.
        kv_transfer_config=kv_config(cpu_bytes_to_use="4MiB"),
        kv_events_config=router.events_config(),
    )
    first = run(llm, A)
    evict(llm)
    router.drain()

    gpu = device_hashes(router, list(first.prompt_token_ids))
    removed = {h for e in router.removed if e.medium == "CPU" for h in e.block_hashes}
    assert set(gpu) <= removed
    assert not set(gpu) & router.index["CPU"]
    assert 0 < len(router.index["CPU"]) <= 8
    assert router.removed_unknown == [], "removed only what was announced"


def test_chunks_on_disk_are_announced_by_tier_and_after_a_restart(
    llm_factory: LLMFactory, tiny_model: BuiltModel, router: Router, tmp_path: Path
) -> None:
    tiers = [{"type": "file", "path": str(tmp_path / "kv"), "capacity": "64MiB"}]
    first_engine = llm_factory(
        **tiny_model.vllm_args(),
        **DEVICE,
        kv_transfer_config=kv_config(secondary_tiers=tiers),
        kv_events_config=router.events_config(),
    )
    first = run(first_engine, A)
    evict(first_engine)
    router.drain()
    gpu = device_hashes(router, list(first.prompt_token_ids))
    disk = [e for e in router.stored_on("STORAGE") if e.block_hashes[0] in gpu]
    assert len(disk) == 2
    assert {e.ownership for e in disk} == {"file"}
    first_engine.llm_engine.engine_core.shutdown()

    # A new engine finds the chunks on disk at start-up; it knows nothing of their
    # tokens until a request of its own loads them, and then announces them.
    router.stored.clear()
    restarted = llm_factory(
        **tiny_model.vllm_args(),
        **DEVICE,
        kv_transfer_config=kv_config(secondary_tiers=tiers),
        kv_events_config=router.events_config(),
    )
    router.drain()
    assert not router.stored_on("STORAGE"), "nothing announced without a description"
    again = run(restarted, A)
    assert again.num_cached_tokens == 2 * BLOCK
    router.drain()
    late = {e.block_hashes[0]: e for e in router.stored_on("STORAGE")}
    assert set(gpu) <= set(late)
    assert late[gpu[1]].parent_block_hash == gpu[0]
    assert set(gpu) <= {e.block_hashes[0] for e in router.stored_on("CPU")}
