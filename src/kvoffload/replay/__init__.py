"""Replay and planning: run a trace through the real scheduler-side code against the
engine model, and compare policies and capacities with the offline optimum."""

from kvoffload.replay.belady import OfflineResult, belady, infinite
from kvoffload.replay.generators import (
    ChatAgentsSpec,
    ReasoningSpec,
    chat_agents,
    reasoning,
)
from kvoffload.replay.mooncake import load_mooncake
from kvoffload.replay.runner import ReplayResult, ReplaySettings, run_replay
from kvoffload.replay.workload import Workload, WorkloadRequest

__all__ = [
    "ChatAgentsSpec",
    "OfflineResult",
    "ReasoningSpec",
    "ReplayResult",
    "ReplaySettings",
    "Workload",
    "WorkloadRequest",
    "belady",
    "chat_agents",
    "infinite",
    "load_mooncake",
    "reasoning",
    "run_replay",
]
