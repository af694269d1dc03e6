"""Building the data plane for the engine's KV tensors: layout, host pool, worker.

The one place that picks the CPU or the CUDA worker, from where the tensors are.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence

from kvoffload.worker.base import TransferWorker
from kvoffload.worker.host_pool import DEFAULT_SHM_DIR, HostPool
from kvoffload.worker.layout import GroupSpec, KVCaches, KVLayout, describe_kv_caches

# The pool's memory cannot be had: no room in the shared-memory file system
# (ENOSPC, EFBIG) or none to map (ENOMEM).
_NO_ROOM = frozenset({errno.ENOSPC, errno.EFBIG, errno.ENOMEM})


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
    ranks: int = 1,
    pool_name: str | None = None,
    shm_dir: str = DEFAULT_SHM_DIR,
    copy_threads: int = 1,
) -> tuple[KVLayout, HostPool, TransferWorker]:
    """Register `kv_caches`, allocate the host pool from the byte budget, start
    the worker. With `pool_name` the pool is shared memory others can attach to.

    `cpu_bytes_to_use` is shared by the pools of the engine's `ranks`
    tensor-parallel ranks: this rank's pool gets the slots of a `ranks`-th
    (`PoolGeometry.num_slots_for`). A budget the host cannot give (`shm_dir` too
    small, say) is a `ValueError` naming `cpu_bytes_to_use` and the room there is."""
    layout = describe_kv_caches(kv_caches, groups)
    pool = _create_pool(layout, cpu_bytes_to_use, ranks, pool_name, shm_dir)
    try:
        worker = create_transfer_worker(
            kv_caches, layout, pool, copy_threads=copy_threads
        )
        return layout, pool, worker
    except BaseException:
        pool.close()
        raise


def _create_pool(
    layout: KVLayout,
    cpu_bytes_to_use: int,
    ranks: int,
    pool_name: str | None,
    shm_dir: str,
) -> HostPool:
    """The host pool, or a start-up error naming `cpu_bytes_to_use` when its
    memory cannot be had (the kernel's bare "No space left on device" names
    neither the setting nor the room there is)."""
    num_slots = layout.geometry.num_slots_for(cpu_bytes_to_use, ranks)
    try:
        return HostPool.create(
            layout.geometry,
            num_slots,
            name=pool_name,
            shm_dir=shm_dir,
            layout=layout.fingerprint,
        )
    except (OSError, OverflowError) as exc:
        if isinstance(exc, OSError) and exc.errno not in _NO_ROOM:
            raise
        # The ranks' pools share the host, so the room they need is their sum.
        needed = num_slots * layout.geometry.slot_nbytes * ranks
        where = "" if ranks == 1 else f" on each of {ranks} ranks"
        raise ValueError(
            f"cpu_bytes_to_use: {_size(cpu_bytes_to_use)} does not fit in "
            f"{_room(pool_name, shm_dir)}: its {num_slots} chunk slots{where} need "
            f"{_size(needed)} ({exc}); lower cpu_bytes_to_use"
            f"{_make_room_hint(pool_name, shm_dir)}"
        ) from exc


def _room(pool_name: str | None, shm_dir: str) -> str:
    """Where the pool's memory comes from, and how much there is."""
    if pool_name is None:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return f"this host's memory, {_size(total)} in all"
    try:
        stats = os.statvfs(shm_dir)
    except OSError:
        return shm_dir
    return f"{shm_dir}, which has {_size(stats.f_bavail * stats.f_frsize)} free"


def _make_room_hint(pool_name: str | None, shm_dir: str) -> str:
    if pool_name is None:
        return ""
    if shm_dir == DEFAULT_SHM_DIR:
        return f" or give {shm_dir} more room (a container's is set by --shm-size)"
    return f" or give {shm_dir} more room"


def _size(nbytes: int) -> str:
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes} bytes ({nbytes / (1 << shift):.1f} {unit})"
    return f"{nbytes} bytes"
