"""vLLM KV events for kvoffload's chunks, in vLLM's own block hashes.

kvoffload keys a chunk by its own hash chain (it covers the model, vLLM's does not),
which no KV-aware router can match against vLLM's device blocks. So the scheduler
describes each chunk in vLLM's terms while its request is still alive: vLLM's hashes
of the chunk's blocks, the parent block's hash, the tokens, the LoRA adapter and the
extra keys (cache salt, multimodal inputs), as vLLM's own device-block events carry
them. Stored and removed events then carry that description, once per tier the chunk
enters or leaves (`medium`, and for secondary tiers `ownership`: the tier's name).

A chunk becomes resident in a tier before it is described only when this engine did
not store it: found in a shared directory at start-up, adopted from another engine,
or promoted from a secondary tier. It is announced once a request of this engine
loads it; until then, and for requests vLLM gives no block hashes (prefix caching
off), nothing is published for it. Descriptions cost about four bytes a token of
scheduler memory for every chunk resident in any tier.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_events import (
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.events import (
    get_offloading_event_group_spec,
)
from vllm.v1.core.kv_cache_utils import (
    generate_block_hash_extra_keys,
    maybe_convert_block_hash,
    resolve_block_hashes,
    to_event_extra_keys,
)

from kvoffload.integrations.vllm.engine_shape import EngineShape
from kvoffload.keys import OffloadKey
from kvoffload.tiers.base import OffloadingEvent
from kvoffload.tiers.primary import CPUOffloadingManager


@dataclass(frozen=True, slots=True)
class ChunkPayload:
    """One chunk as vLLM's events describe blocks (hashes already external)."""

    block_hashes: tuple[Any, ...]
    parent_block_hash: Any
    token_ids: array[int]
    block_size: int
    lora_id: int | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None
    group: int


@dataclass(slots=True)
class _Resident:
    payload: ChunkPayload | None
    # tier name -> (medium, ownership) of each tier holding the chunk
    tiers: dict[str, tuple[str, str | None]] = field(default_factory=dict)


class KVEventDescriber:
    """Describes chunks from live requests; turns kvoffload's events into vLLM's.

    `describe` takes the chunks the connector's `ChunkObserver` hears of, with the
    live vLLM `Request`. Descriptions of chunks not yet resident anywhere (a store
    in flight) are kept for the last `pending` of them, the number of host slots
    in the connector: a store that fails never becomes resident, and its
    description falls out.
    """

    def __init__(
        self, kv_cache_config: Any, shape: EngineShape, pending: int = 4096
    ) -> None:
        self._hash_block_size = int(
            getattr(kv_cache_config, "hash_block_size", None) or shape.hash_block_tokens
        )
        self._specs = [
            get_offloading_event_group_spec(g) for g in kv_cache_config.kv_cache_groups
        ]
        self._groups = shape.groups
        self._pending_limit = max(1, pending)
        self._pending: OrderedDict[OffloadKey, ChunkPayload] = OrderedDict()
        self._resident: dict[OffloadKey, _Resident] = {}
        self._late: list[KVCacheEvent] = []

    def __len__(self) -> int:
        """Chunks described or resident (what this costs in memory)."""
        return len(self._pending) + len(self._resident)

    # -- descriptions ------------------------------------------------------------

    def describe(
        self, request: Any, group: int, chunks: Sequence[tuple[int, OffloadKey]]
    ) -> None:
        """Describe chunks of `request` (a live vLLM `Request`) in one group."""
        hashes = self._block_hashes(request, group)
        for chunk, key in chunks:
            resident = self._resident.get(key)
            if resident is not None and resident.payload is not None:
                continue
            payload = self._payload(request, group, chunk, hashes)
            if payload is None:
                continue
            if resident is not None:  # resident before described: announce now
                resident.payload = payload
                self._late.extend(
                    self._stored(payload, medium, owner)
                    for medium, owner in resident.tiers.values()
                )
                continue
            self._pending[key] = payload
            self._pending.move_to_end(key)
            if len(self._pending) > self._pending_limit:
                self._pending.popitem(last=False)

    def _block_hashes(self, request: Any, group: int) -> Any:
        """vLLM's hashes at the group's block size (a list, or vLLM's view of one)."""
        raw = getattr(request, "block_hashes", None) or ()
        size = self._groups[group].tokens_per_block
        return resolve_block_hashes(raw, self._hash_block_size, size) if raw else ()

    def _payload(
        self, request: Any, group: int, chunk: int, hashes: Any
    ) -> ChunkPayload | None:
        shape = self._groups[group]
        per, size = shape.blocks_per_chunk, shape.tokens_per_block
        first = chunk * per
        if first + per > len(hashes):
            return None  # vLLM has not hashed these blocks (prefix caching off)
        blocks = [hashes[b] for b in range(first, first + per)]
        if any(h is None for h in blocks):
            return None
        start, end = first * size, (first + per) * size
        extra: list[tuple[Any, ...] | None] = []
        mm_index = 0
        for b in range(start, end, size):
            keys, mm_index = generate_block_hash_extra_keys(
                request, b, b + size, mm_index
            )
            extra.append(keys)
        lora = getattr(request, "lora_request", None)
        return ChunkPayload(
            block_hashes=tuple(maybe_convert_block_hash(h) for h in blocks),
            parent_block_hash=(
                maybe_convert_block_hash(hashes[first - 1]) if first else None
            ),
            token_ids=array("i", request.all_token_ids[start:end]),
            block_size=size,
            lora_id=lora.adapter_id if lora is not None else None,
            lora_name=lora.name if lora is not None else None,
            extra_keys=to_event_extra_keys(extra),
            group=group,
        )

    # -- events ------------------------------------------------------------------

    def translate(self, events: Iterable[OffloadingEvent]) -> list[KVCacheEvent]:
        """vLLM events for kvoffload's stored/removed events, in order.

        `events` is one batch (`take_events`): a chunk that leaves its last tier
        keeps its description until the batch ends, so a store later in the same
        batch (the file tier's write landing as host memory evicts it, a store
        again after an eviction) is still announced.
        """
        out, self._late = self._late, []
        left: set[OffloadKey] = set()  # chunks that left a tier in this batch
        for event in events:
            # Secondary tiers are named in `ownership`; host memory is the engine's.
            owner = None if event.tier == CPUOffloadingManager.name else event.tier
            medium = event.medium.upper()
            if event.removed:
                out.extend(self._removed(event.keys, event.tier, medium, owner, left))
                continue
            for key in event.keys:
                resident = self._resident.get(key)
                if resident is None:
                    resident = self._resident[key] = _Resident(
                        self._pending.pop(key, None)
                    )
                if event.tier in resident.tiers:
                    continue
                resident.tiers[event.tier] = (medium, owner)
                if resident.payload is not None:
                    out.append(self._stored(resident.payload, medium, owner))
        for key in left:
            resident = self._resident.get(key)
            if resident is not None and not resident.tiers:
                del self._resident[key]
        return out

    def _removed(
        self,
        keys: Iterable[OffloadKey],
        tier: str,
        medium: str,
        owner: str | None,
        left: set[OffloadKey],
    ) -> list[KVCacheEvent]:
        """Removed events for `keys` leaving `tier`; adds them to `left`."""
        by_group: dict[int, list[Any]] = {}
        for key in keys:
            resident = self._resident.get(key)
            if resident is None or resident.tiers.pop(tier, None) is None:
                continue
            left.add(key)
            if resident.payload is not None:
                by_group.setdefault(resident.payload.group, []).extend(
                    resident.payload.block_hashes
                )
        return [
            BlockRemoved(
                block_hashes=hashes, medium=medium, group_idx=group, ownership=owner
            )
            for group, hashes in by_group.items()
        ]

    def _stored(
        self, payload: ChunkPayload, medium: str, owner: str | None
    ) -> BlockStored:
        spec = self._specs[payload.group]
        return BlockStored(
            block_hashes=list(payload.block_hashes),
            parent_block_hash=payload.parent_block_hash,
            token_ids=payload.token_ids.tolist(),
            block_size=payload.block_size,
            lora_id=payload.lora_id,
            medium=medium,
            lora_name=payload.lora_name,
            extra_keys=payload.extra_keys,
            group_idx=payload.group,
            kv_cache_spec_kind=spec.kv_cache_spec_kind,
            kv_cache_spec_sliding_window=spec.kv_cache_spec_sliding_window,
            ownership=owner,
        )

    def reset(self) -> None:
        """The cache was reset: stores in flight will not complete. (The tiers
        announce what they drop as removed.)"""
        self._pending.clear()
