"""What kvoffload needs to know about a vLLM engine's KV cache, read once.

From `KVCacheConfig`: the KV-cache groups (engine block size, layers, bytes per
block per layer), the hash granularity; from `VllmConfig`: the model identity,
parallelism, whether the engine keeps a prefix cache and whether it names
multimodal inputs by their content. Both connector roles derive the same shape,
so the scheduler computes the same number of host slots as every worker
allocates, and the same fingerprint names the model and layout in keys, files
and Redis.

How the KV bytes are arranged in memory (the attention backend's K/V-major or
block-major tensors, NHD or HND) is known only to the workers, which see the
tensors: each records it in its host pool's header, and the scheduler, which
attaches the pools, adds it to the fingerprints (`with_kv_layouts`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from kvoffload.integrations.vllm.config import KVOffloadSettings
from kvoffload.integrations.vllm.model_identity import model_identity
from kvoffload.tiers.secondary import make_fingerprint
from kvoffload.worker import GroupGeometry, PoolGeometry

# vLLM's block 0 is the null block: never allocated to a request, used by
# sliding-window groups for blocks outside the window.
VLLM_NULL_BLOCK = 0
# `EngineShape.model` on the worker side, which never names chunks.
UNIDENTIFIED = ""


@dataclass(frozen=True)
class GroupShape:
    """One KV-cache group of the engine."""

    index: int
    tokens_per_block: int
    blocks_per_chunk: int
    layer_names: tuple[str, ...]
    layer_block_nbytes: int
    kind: str


@dataclass(frozen=True)
class EngineShape:
    """The engine's KV-cache groups, model identity and parallelism.

    `prefix_caching` is vLLM's `enable_prefix_caching`: whether blocks one request
    loads serve other requests from the engine's own cache. `mm_by_content`:
    whether vLLM names every multimodal input by a hash of its content or by the
    uuid its client gave it (`names_mm_by_content`). `kv_layouts` is each rank's
    `KVLayout.fingerprint`, in rank order, once read from the host pools.
    """

    groups: tuple[GroupShape, ...]
    num_blocks: int
    hash_block_tokens: int
    model: str  # `model_identity`: what names the model's KV
    dtype: str
    tp_size: int
    engine_id: str
    prefix_caching: bool = True
    mm_by_content: bool = True
    kv_layouts: tuple[str, ...] = ()

    @classmethod
    def from_vllm(
        cls,
        vllm_config: Any,
        kv_cache_config: Any,
        settings: KVOffloadSettings,
        identify_model: bool = True,
    ) -> EngineShape:
        """The engine's shape; without `identify_model` (a worker, which names no
        chunks) the model's weights and config are not read, and the
        fingerprints are unavailable."""
        groups: list[GroupShape] = []
        for index, group in enumerate(kv_cache_config.kv_cache_groups):
            spec = group.kv_cache_spec
            kind = type(spec).__name__
            nbytes = getattr(spec, "real_page_size_bytes", None)
            if nbytes is None or not hasattr(spec, "num_kv_heads"):
                raise ValueError(
                    f"kvoffload: KV-cache group {index} is {kind}; only attention "
                    "groups (full, sliding window) can be offloaded"
                )
            groups.append(
                GroupShape(
                    index=index,
                    tokens_per_block=int(spec.block_size),
                    blocks_per_chunk=settings.blocks_per_chunk_for(
                        int(spec.block_size)
                    ),
                    layer_names=tuple(group.layer_names),
                    layer_block_nbytes=int(nbytes),
                    kind=kind,
                )
            )
        if not groups:
            raise ValueError("kvoffload: the engine has no KV-cache groups to offload")
        hash_tokens = math.gcd(*(g.tokens_per_block for g in groups))
        parallel = vllm_config.parallel_config
        _refuse_unsupported_parallelism(parallel)
        model = vllm_config.model_config
        transfer = vllm_config.kv_transfer_config
        return cls(
            groups=tuple(groups),
            num_blocks=int(kv_cache_config.num_blocks),
            hash_block_tokens=hash_tokens,
            model=(
                model_identity(vllm_config, settings.model_tag)
                if identify_model
                else UNIDENTIFIED
            ),
            dtype=str(model.dtype),
            tp_size=int(parallel.tensor_parallel_size),
            engine_id=str(transfer.engine_id),
            prefix_caching=bool(vllm_config.cache_config.enable_prefix_caching),
            mm_by_content=names_mm_by_content(vllm_config),
        )

    def with_kv_layouts(self, layouts: Iterable[str]) -> EngineShape:
        """This shape, with the ranks' KV memory layouts, in rank order."""
        return replace(self, kv_layouts=tuple(layouts))

    def model_fingerprint(self) -> str:
        """Names the model and the per-token KV layout in every block hash."""
        if self.model == UNIDENTIFIED:
            raise RuntimeError("kvoffload: a worker's engine shape names no model")
        return make_fingerprint(
            {
                "model": self.model,
                "dtype": self.dtype,
                "groups": [
                    [
                        g.kind,
                        g.tokens_per_block,
                        len(g.layer_names),
                        g.layer_block_nbytes,
                    ]
                    for g in self.groups
                ],
                "tp_size": self.tp_size,
                "kv_layouts": list(self.kv_layouts),
                "hash": "sha256",
            }
        )

    def chunk_fingerprint(self, rank: int) -> str:
        """Names what one rank's chunk bytes mean (files, Redis keys, headers)."""
        return make_fingerprint(
            {
                "model": self.model_fingerprint(),
                "blocks_per_chunk": [g.blocks_per_chunk for g in self.groups],
                "tp_rank": rank,
            }
        )

    def tiers_fingerprint(self) -> str:
        """Names what a chunk in a secondary tier means: every rank's slice, in
        rank order (with one rank, the same as that rank's chunk)."""
        if self.tp_size == 1:
            return self.chunk_fingerprint(0)
        return make_fingerprint(
            {
                "model": self.model_fingerprint(),
                "blocks_per_chunk": [g.blocks_per_chunk for g in self.groups],
                "tp_ranks": self.tp_size,
            }
        )

    def pool_geometry(self) -> PoolGeometry:
        return PoolGeometry.of(
            GroupGeometry(
                g.index, len(g.layer_names), g.layer_block_nbytes, g.blocks_per_chunk
            )
            for g in self.groups
        )

    def host_slots(self, cpu_bytes_to_use: int) -> int:
        """The chunk slots of each rank's host pool: `cpu_bytes_to_use` is the
        engine's total over its tensor-parallel ranks, as in vLLM's
        OffloadingConnector. The scheduler side and every worker count the same."""
        return self.pool_geometry().num_slots_for(cpu_bytes_to_use, self.tp_size)

    def pool_name(self, rank: int) -> str:
        return f"kvoffload-{self.engine_id}-r{rank}"


def names_mm_by_content(vllm_config: Any) -> bool:
    """Whether vLLM names every multimodal input by a hash of its content (or by
    the uuid its client gave it in `multi_modal_uuids`).

    With the multimodal processor cache off (`mm_processor_cache_gb=0`) and
    prefix caching off, vLLM's renderer (`BaseRenderer._process_mm_uuids`) skips
    content hashing and names an input with no client uuid
    `renderer<rank>-mm-<n>-<modality>-<i>`, `n` counting the process's requests
    from 1: the same name for different images after a restart or on another
    engine. Client uuids are then indistinguishable from those names (with
    processor kwargs both are hashed), so no input of such an engine is named by
    its content.
    """
    mm = getattr(vllm_config.model_config, "multimodal_config", None)
    return (
        mm is None
        or mm.mm_processor_cache_gb != 0
        or bool(vllm_config.cache_config.enable_prefix_caching)
    )


# Parallel layouts whose ranks hold different layers or different tokens of one
# chunk: the host pools, their names and cpu_bytes_to_use's split follow tensor
# parallel ranks only, so these would share pool names across stages and split
# the budget unlike vLLM. Refused at start-up rather than served wrongly.
_UNSUPPORTED_PARALLELISM = (
    "pipeline_parallel_size",
    "prefill_context_parallel_size",
    "decode_context_parallel_size",
)


def _refuse_unsupported_parallelism(parallel: Any) -> None:
    for name in _UNSUPPORTED_PARALLELISM:
        size = getattr(parallel, name, 1)
        if size not in (None, 1):
            raise ValueError(
                f"kvoffload: {name}={size!r} is not supported; kvoffload runs "
                "with tensor parallelism only (every other parallel size 1)"
            )
