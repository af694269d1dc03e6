"""The data plane: copies chunks between the engine's KV cache and the host pool.

Importing this package needs no torch: it exports the vocabulary, the geometry
the scheduler computes and the host pool secondary tiers share. The torch parts
live in `kvoffload.worker.layout` (registration) and `kvoffload.worker.factory`
(`create_data_plane`, `create_transfer_worker`).
"""

from kvoffload.worker.base import (
    ChunkBuffer,
    GroupTransfer,
    JobResult,
    TransferDirection,
    TransferJob,
    TransferWorker,
)
from kvoffload.worker.geometry import GroupGeometry, PoolGeometry
from kvoffload.worker.host_pool import HostPool

__all__ = [
    "ChunkBuffer",
    "GroupGeometry",
    "GroupTransfer",
    "HostPool",
    "JobResult",
    "PoolGeometry",
    "TransferDirection",
    "TransferJob",
    "TransferWorker",
]
