"""`bench vllm --peer`: the configurations, and the copy worker that lets vLLM's
own OffloadingConnector run on the CPU platform (no engine is started here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvoffload.bench import vllm as bench


def test_peer_configurations_name_their_policy_and_the_same_host_bytes(
    tmp_path: Path,
) -> None:
    args = bench.parse_args(["--peer", "--host-bytes=10MiB"])
    native = bench.kv_transfer_config("native-arc", args, 1, str(tmp_path))
    assert native is not None
    extra = native["kv_connector_extra_config"]
    assert native["kv_connector"] == "OffloadingConnector"
    assert (extra["spec_name"], extra["spec_module_path"]) == (
        "HostCopySpec",
        "kvoffload.bench.vllm_native",
    )
    assert (extra["cpu_bytes_to_use"], extra["eviction_policy"]) == (10 << 20, "arc")
    ours = bench.kv_transfer_config("kvoffload-split", args, 1, str(tmp_path))
    assert ours is not None
    assert ours["kv_connector_extra_config"] == {
        "cpu_bytes_to_use": "10MiB",
        "eviction_policy": "split",
    }
    assert bench.PEER_CONFIGS[0] == "none"


def test_bad_turn_orders_are_refused_naming_the_value() -> None:
    args = bench.parse_args(["--order", "sideways"])
    with pytest.raises(ValueError, match="sideways"):
        bench.workload_from(args)


def test_the_copy_worker_moves_each_block_to_its_chunks_row_and_back() -> None:
    """Scenario: two groups over two KV tensors, 2 blocks a chunk. A store of
    group 0's blocks 5, 6, 7 from logical block 1 (entering chunk 10 half way,
    then chunk 11) and group 1's block 2 from logical block 0 (chunk 12); then a
    load of the same chunks into other device blocks gives the same bytes."""
    pytest.importorskip("vllm", reason="vLLM is not installed")
    import torch
    from vllm.v1.kv_offload.base import (
        CanonicalKVCacheRef,
        CanonicalKVCaches,
        CanonicalKVCacheTensor,
        GPULoadStoreSpec,
    )
    from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

    from kvoffload.bench.vllm_native import HostCopyWorker

    page = 8
    tensors = [
        torch.arange(16 * page, dtype=torch.int8).view(16, page) + t for t in (0, 50)
    ]
    caches = CanonicalKVCaches(
        [CanonicalKVCacheTensor(t, page) for t in tensors],
        [[CanonicalKVCacheRef(0, page)], [CanonicalKVCacheRef(1, page)]],
    )
    worker = HostCopyWorker(caches, blocks_per_chunk=2, num_chunks=16)
    before = [t.clone() for t in tensors]
    store_dev: Any = GPULoadStoreSpec(
        [5, 6, 7, 2], group_sizes=[3, 1], block_indices=[1, 0]
    )
    assert worker.submit_store(1, store_dev, CPULoadStoreSpec([10, 11, 12]))
    load_dev: Any = GPULoadStoreSpec(
        [13, 14, 15, 9], group_sizes=[3, 1], block_indices=[1, 0]
    )
    assert worker.submit_load(2, CPULoadStoreSpec([10, 11, 12]), load_dev)
    done = worker.get_finished()
    assert [(r.job_id, r.success) for r in done] == [(1, True), (2, True)]
    assert torch.equal(tensors[0][13:16], before[0][5:8])
    assert torch.equal(tensors[1][9], before[1][2])
    assert torch.equal(tensors[0][:13], before[0][:13])
