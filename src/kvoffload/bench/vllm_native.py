"""vLLM's own OffloadingConnector on the CPU platform, for `bench vllm --peer`.

vLLM's `CPUOffloadingSpec` keeps its whole scheduler side (the connector's
lookups, loads and stores, its `CPUOffloadingManager` and LRU/ARC policies) but
its worker copies with CUDA kernels only. `HostCopySpec` is that spec with a
synchronous torch copy worker instead: a transfer is done when it is submitted,
so the comparison is of what each connector keeps and loads; copy times differ.
vLLM loads it by name from the connector's extra config:

    {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
     "kv_connector_extra_config": {"spec_name": "HostCopySpec",
        "spec_module_path": "kvoffload.bench.vllm_native",
        "cpu_bytes_to_use": N, "eviction_policy": "lru"}}

Benchmark code: it imports vLLM, and the product never imports it.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCaches,
    GPULoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec


class HostCopyWorker(OffloadingWorker):
    """Device blocks <-> host chunks with torch indexing, at submission.

    The host buffer of each KV tensor has `blocks_per_chunk` rows of one page per
    chunk. A transfer names, per KV-cache group, its device blocks
    (`group_sizes`) and the logical index of the first (`block_indices`): the
    first chunk of a group may be entered part way, as vLLM's worker does.
    """

    def __init__(
        self, kv_caches: CanonicalKVCaches, blocks_per_chunk: int, num_chunks: int
    ) -> None:
        self._per_chunk = blocks_per_chunk
        self._tensors_of_group = [
            sorted({ref.tensor_idx for ref in refs})
            for refs in kv_caches.group_data_refs
        ]
        self._device: list[torch.Tensor] = []
        self._host: list[torch.Tensor] = []
        for cache in kv_caches.tensors:
            page = cache.page_size_bytes
            self._device.append(cache.tensor.view(torch.int8).view(-1, page))
            self._host.append(
                torch.zeros((num_chunks * blocks_per_chunk, page), dtype=torch.int8)
            )
        self._done: list[TransferResult] = []

    def _rows(
        self, device: GPULoadStoreSpec, host: BlockIDsLoadStoreSpec
    ) -> list[tuple[int, list[int], list[int]]]:
        """(group, device blocks, host rows) of each group of a transfer."""
        blocks = [int(b) for b in device.block_ids]
        chunks = [int(c) for c in host.block_ids]
        out = []
        block_at = chunk_at = 0
        per = self._per_chunk
        for group, (size, first) in enumerate(
            zip(device.group_sizes, device.block_indices, strict=True)
        ):
            size, skip = int(size), int(first) % per
            rows = [
                chunks[chunk_at + (skip + i) // per] * per + (skip + i) % per
                for i in range(size)
            ]
            out.append((group, blocks[block_at : block_at + size], rows))
            block_at += size
            chunk_at += -(-(size + skip) // per) if size else 0
        return out

    def _copy(
        self, job_id: int, device: GPULoadStoreSpec, host: Any, store: bool
    ) -> bool:
        started = time.perf_counter()
        moved = 0
        for group, blocks, rows in self._rows(device, host):
            if not blocks:
                continue
            dev_index = torch.tensor(blocks, dtype=torch.long)
            host_index = torch.tensor(rows, dtype=torch.long)
            for t in self._tensors_of_group[group]:
                if store:
                    self._host[t][host_index] = self._device[t][dev_index]
                else:
                    self._device[t][dev_index] = self._host[t][host_index]
                moved += len(blocks) * self._device[t].shape[1]
        self._done.append(
            TransferResult(job_id, True, moved, time.perf_counter() - started)
        )
        return True

    def submit_store(
        self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: Any
    ) -> bool:
        return self._copy(job_id, src_spec, dst_spec, store=True)

    def submit_load(
        self, job_id: int, src_spec: Any, dst_spec: GPULoadStoreSpec
    ) -> bool:
        return self._copy(job_id, dst_spec, src_spec, store=False)

    def get_finished(self) -> list[TransferResult]:
        done, self._done = self._done, []
        return done

    def wait(self, job_ids: set[int]) -> None:
        del job_ids  # every job ended when it was submitted


class HostCopySpec(CPUOffloadingSpec):
    """vLLM's CPU offloading spec with `HostCopyWorker` as its worker."""

    _host_worker: HostCopyWorker | None = None

    def _uses_shared_region(self) -> bool:
        return False

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._host_worker is None:
            self._host_worker = HostCopyWorker(
                kv_caches, self.blocks_per_chunk, self.num_chunks
            )
        return self._host_worker
