"""kvoffload: tiered KV-cache offloading for LLM inference.

Keeps copies of prefix KV in host memory, on disk and in a shared store, and loads
them back when a later request shares the prefix, so the engine skips that prefill.
"""

from kvoffload.keys import (
    BlockHasher,
    HashRoot,
    OffloadKey,
    chunk_keys,
    make_offload_key,
    offload_key_block_hash,
    offload_key_group,
)
from kvoffload.policies import EvictionPolicy, policy_names, register_policy
from kvoffload.tiers import (
    LookupResult,
    OffloadingEvent,
    OffloadingManager,
    OffloadPolicy,
    PrefixLookup,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    TierStats,
)
from kvoffload.tiers.primary import CPUOffloadingManager

__version__ = "0.1.0"

__all__ = [
    "BlockHasher",
    "CPUOffloadingManager",
    "EvictionPolicy",
    "HashRoot",
    "LookupResult",
    "OffloadKey",
    "OffloadPolicy",
    "OffloadingEvent",
    "OffloadingManager",
    "PrefixLookup",
    "PrepareStoreOutput",
    "ReqContext",
    "RequestOffloadingContext",
    "TierStats",
    "chunk_keys",
    "make_offload_key",
    "offload_key_block_hash",
    "offload_key_group",
    "policy_names",
    "register_policy",
]
