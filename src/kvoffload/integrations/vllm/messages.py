"""What crosses between the scheduler-side and worker-side connectors each step.

Scheduler to workers: the step plan (loads, stores, jobs to finish first). Workers
to scheduler: each rank's job results. Both are plain picklable data: with vLLM's
multiprocessing they cross process boundaries.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)

from kvoffload.connector import StepPlan
from kvoffload.worker import JobResult


@dataclass
class KVOffloadMetadata(KVConnectorMetadata):
    """One step's plan for the workers."""

    plan: StepPlan = field(default_factory=StepPlan)


@dataclass
class KVOffloadWorkerMetadata(KVConnectorWorkerMetadata):
    """Job results per worker rank, folded across ranks by `aggregate`."""

    results: dict[int, list[JobResult]] = field(default_factory=dict)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVOffloadWorkerMetadata:
        merged = {rank: list(found) for rank, found in self.results.items()}
        if isinstance(other, KVOffloadWorkerMetadata):
            for rank, found in other.results.items():
                merged.setdefault(rank, []).extend(found)
        return KVOffloadWorkerMetadata(merged)
