"""The data plane: copies chunks between the engine's KV cache and the host pool."""

from kvoffload.worker.base import (
    ChunkBuffer,
    GroupTransfer,
    JobResult,
    TransferDirection,
    TransferJob,
    TransferWorker,
)

__all__ = [
    "ChunkBuffer",
    "GroupTransfer",
    "JobResult",
    "TransferDirection",
    "TransferJob",
    "TransferWorker",
]
