"""Building the data plane for the engine's KV tensors: layout, host pool, worker.

The one place that picks the CPU or the CUDA worker, from where the tensors are.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvoffload.worker.base import TransferWorker
from kvoffload.worker.host_pool import DEFAULT_SHM_DIR, HostPool
from kvoffload.worker.layout import GroupSpec, KVCaches, KVLayout, describe_kv_caches


def create_transfer_worker(
    kv_caches: KVCaches, layout: KVLayout, pool: HostPool, *, copy_threads: int = 1
) -> TransferWorker:
    """A worker copying between `kv_caches` (as `layout` describes) and `pool`.

    `copy_threads` (CPU only) is how many threads share one job's copies.
    """
    if layout.device == "cpu":
        from kvoffload.worker.cpu_worker import CpuTransferWorker

        return CpuTransferWorker(kv_caches, layout, pool, copy_threads=copy_threads)
    if copy_threads != 1:
        raise ValueError(
            f"copy_threads: {copy_threads!r} applies to KV tensors on the CPU only; "
            f"these are on {layout.device}"
        )
    if layout.device.startswith("cuda"):
        from kvoffload.worker.cuda_worker import CudaTransferWorker

        return CudaTransferWorker(kv_caches, layout, pool)
    raise ValueError(
        f"KV tensors on {layout.device!r} are not supported; allowed: cpu, cuda"
    )


def create_data_plane(
    kv_caches: KVCaches,
    groups: Sequence[GroupSpec],
    cpu_bytes_to_use: int,
    *,
    pool_name: str | None = None,
    shm_dir: str = DEFAULT_SHM_DIR,
    copy_threads: int = 1,
) -> tuple[KVLayout, HostPool, TransferWorker]:
    """Register `kv_caches`, allocate the host pool from the byte budget, start
    the worker. With `pool_name` the pool is shared memory others can attach to."""
    layout = describe_kv_caches(kv_caches, groups)
    num_slots = layout.geometry.num_slots_for(cpu_bytes_to_use)
    pool = HostPool.create(
        layout.geometry,
        num_slots,
        name=pool_name,
        shm_dir=shm_dir,
        layout=layout.fingerprint,
    )
    try:
        worker = create_transfer_worker(
            kv_caches, layout, pool, copy_threads=copy_threads
        )
        return layout, pool, worker
    except BaseException:
        pool.close()
        raise
