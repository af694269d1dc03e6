"""The scheduler-side connector: lookups, loads and stores, engine-agnostic."""

from kvoffload.connector.base import (
    ChunkObserver,
    Clock,
    ConnectorStats,
    RequestInfo,
    ScheduledRequest,
    StepPlan,
)
from kvoffload.connector.config import ConnectorConfig, GroupSpec
from kvoffload.connector.scheduler import OffloadConnector

__all__ = [
    "ChunkObserver",
    "Clock",
    "ConnectorConfig",
    "ConnectorStats",
    "GroupSpec",
    "OffloadConnector",
    "RequestInfo",
    "ScheduledRequest",
    "StepPlan",
]
