"""An engine started in this process whose start fails after its worker registered.

With `VLLM_ENABLE_V1_MULTIPROCESSING=0` and one rank, the worker runs in the
caller's process and vLLM keeps its worker-role connector in a process-wide slot
(`kv_transfer_state`). A start that fails after the worker registered its KV
caches (the scheduler-role connector refusing a secondary tier, say) does not
shut that connector down: it keeps its host pool, and the next engine started in
the process reuses it, with the failed engine's settings and pool name (its
`register_kv_caches` then found its own pool: `FileExistsError`). So the
scheduler-role connector that fails releases its engine's worker connector, and a
worker connector registered for another engine than its own refuses, once
released, rather than serving that engine with the wrong settings.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)


def release_worker(engine_id: str) -> None:
    """Shut down the worker-role connector this process holds for engine
    `engine_id`, if any, which removes its host pool, and empty vLLM's slot for
    it, so that the next engine of this process creates its own from its own
    settings. Called when that engine's start failed."""
    from vllm.distributed.kv_transfer.kv_transfer_state import (
        ensure_kv_transfer_shutdown,
        get_kv_transfer_group,
        has_kv_transfer_group,
    )

    if not has_kv_transfer_group():
        return  # the workers run in processes of their own
    if getattr(get_kv_transfer_group(), "engine_id", None) != engine_id:
        return
    logger.info(
        "kvoffload: engine %s failed to start; its worker's host pool is released",
        engine_id,
    )
    ensure_kv_transfer_shutdown()


def refuse_another_engine(engine_id: str, shutdown: Callable[[], None]) -> None:
    """Called as the worker-role connector of engine `engine_id` registers KV
    caches: if vLLM is starting another engine (its current config names
    another engine id), the connector is one a failed start left, which vLLM
    reuses. Then `shutdown` it, release it (`release_worker`) and raise
    `RuntimeError`: its settings are not the new engine's, and the next start
    creates its own connector."""
    from vllm.config import get_current_vllm_config_or_none

    current = get_current_vllm_config_or_none()
    transfer = getattr(current, "kv_transfer_config", None)
    starting = getattr(transfer, "engine_id", None)
    if starting is None or str(starting) == engine_id:
        return
    shutdown()
    release_worker(engine_id)
    raise RuntimeError(
        f"kvoffload: vLLM reused the KV connector of engine {engine_id}, whose "
        f"start in this process failed, for engine {starting}; that connector "
        "and its host pool are released now: start the engine again"
    )
