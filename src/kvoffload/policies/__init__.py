"""Eviction policies, registered by name (`lru`, `arc`, `split`, ...)."""

from kvoffload.policies.arc import ARCPolicy
from kvoffload.policies.base import (
    Evictable,
    EvictionPolicy,
    Refusing,
    StopEviction,
    StopList,
    create_policy,
    get_policy_class,
    policy_names,
    register_policy,
)
from kvoffload.policies.lru import LRUPolicy
from kvoffload.policies.split_lru import SplitLRUPolicy

__all__ = [
    "ARCPolicy",
    "Evictable",
    "EvictionPolicy",
    "LRUPolicy",
    "Refusing",
    "SplitLRUPolicy",
    "StopEviction",
    "StopList",
    "create_policy",
    "get_policy_class",
    "policy_names",
    "register_policy",
]
