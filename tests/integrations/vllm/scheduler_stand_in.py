"""vLLM's scheduler and workers, played by a test, around a real `KVOffloadConnector`.

The connector is built in the scheduler role from the parts of a `VllmConfig` it
reads and a real `KVCacheConfig` (one group of 4-token blocks, chunks of 2 blocks),
and is called through the hooks vLLM's scheduler calls. Workers are played by
reporting every job of a step as done, so no engine starts (seconds, not minutes).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

from kvoffload.connector import StepPlan
from kvoffload.integrations.vllm.config import KVOffloadSettings
from kvoffload.integrations.vllm.engine_shape import EngineShape
from kvoffload.integrations.vllm.messages import (
    KVOffloadMetadata,
    KVOffloadWorkerMetadata,
)
from kvoffload.worker import HostPool, JobResult, TransferWorker
from kvoffload.worker.factory import create_data_plane
from kvoffload.worker.layout import GroupSpec as WorkerGroupSpec

BLOCK = 4
PER_CHUNK = 2
CHUNK = BLOCK * PER_CHUNK
HOST_SLOTS = 16
JOB_BYTES = 1000
JOB_SECONDS = 0.25


def kv_cache_config() -> Any:
    import torch
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
    )

    spec = FullAttentionSpec(
        block_size=BLOCK, num_kv_heads=1, head_size=4, dtype=torch.float32
    )
    return KVCacheConfig(
        num_blocks=256,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)],
        hash_block_size=BLOCK,
    )


def vllm_config(
    extra: Mapping[str, Any],
    prefix_caching: bool = True,
    mm_processor_cache_gb: float | None = None,
) -> Any:
    """The parts of a `VllmConfig` the connector reads; a multimodal model's
    with `mm_processor_cache_gb`."""
    multimodal = (
        None
        if mm_processor_cache_gb is None
        else SimpleNamespace(mm_processor_cache_gb=mm_processor_cache_gb)
    )
    return SimpleNamespace(
        kv_transfer_config=SimpleNamespace(
            kv_load_failure_policy="recompute",
            kv_connector_extra_config=dict(extra),
            engine_id=f"stand-in-{uuid.uuid4().hex[:8]}",
        ),
        parallel_config=SimpleNamespace(tensor_parallel_size=1),
        model_config=SimpleNamespace(
            model="tiny",
            dtype="float32",
            hf_config=None,
            quantization=None,
            multimodal_config=multimodal,
        ),
        cache_config=SimpleNamespace(
            cache_dtype="auto", enable_prefix_caching=prefix_caching
        ),
        kv_events_config=None,
    )


def request(
    req_id: str, tokens: list[int], resumable: bool = False, mm_features: Any = None
) -> Any:
    """A vLLM request; `resumable`: a streaming-input session (vLLM extends the
    prompt list it is given, so it gets a copy)."""
    from vllm import SamplingParams
    from vllm.v1.request import Request

    return Request(
        req_id,
        list(tokens),
        SamplingParams(max_tokens=1),
        None,
        resumable=resumable,
        mm_features=mm_features,
    )


def counter_named_image(offset: int, length: int) -> Any:
    """An image as the first request of a fresh vLLM process names it with prefix
    caching and the multimodal processor cache off, whatever the image: vLLM's
    own `BaseRenderer._process_mm_uuids` gives it `renderer0-mm-1-image-0`."""
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
    from vllm.renderers.base import BaseRenderer
    from vllm.utils.counter import AtomicCounter

    renderer = SimpleNamespace(
        model_config=SimpleNamespace(
            multimodal_config=SimpleNamespace(mm_processor_cache_gb=0)
        ),
        config=SimpleNamespace(
            cache_config=SimpleNamespace(enable_prefix_caching=False)
        ),
        _validate_mm_uuids=lambda *args: None,
        _mm_req_counter=AtomicCounter(),
        api_process_rank=0,
    )
    mm_req_id = f"renderer0-mm-{renderer._mm_req_counter.inc(1)}"
    items = SimpleNamespace(get_all_counts=lambda: {"image": 1})
    uuids = BaseRenderer._process_mm_uuids(
        renderer, {"image": object()}, items, {}, mm_req_id
    )
    name = uuids["image"][0]
    assert name is not None
    return MultiModalFeatureSpec(
        None, "image", name, PlaceholderRange(offset=offset, length=length)
    )


def take_next_input(session: Any, tokens: list[int], mm_features: Any = None) -> None:
    """End a streaming-input session's turn after its last sampled token and give it
    its next input, with vLLM's own code: every token but that one is computed
    (`_handle_stopped_request`), then `_update_request_as_session` drops it and
    appends `tokens`, which join the prompt."""
    from vllm import SamplingParams
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import RequestStatus, StreamingUpdate

    session.num_computed_tokens = session.num_tokens - 1
    session.status = RequestStatus.WAITING_FOR_STREAMING_REQ
    update = StreamingUpdate(
        mm_features=mm_features,
        prompt_token_ids=tokens,
        max_tokens=1,
        arrival_time=time.time(),
        sampling_params=SamplingParams(max_tokens=1),
    )
    scheduler = SimpleNamespace(
        hash_block_size=BLOCK, num_waiting_for_streaming_input=1, log_stats=False
    )
    Scheduler._update_request_as_session(scheduler, session, update)


class SchedulerStandIn:
    """Drives a scheduler-role `KVOffloadConnector` as vLLM's engine would."""

    def __init__(
        self,
        extra: Mapping[str, Any],
        prefix_caching: bool = True,
        kv_cache: Any = None,
        mm_processor_cache_gb: float | None = None,
    ):
        """`kv_cache`, layer l0's KV tensor, registers a real worker's data plane
        (which records the tensor's memory layout in the pool);
        `mm_processor_cache_gb` makes the model multimodal."""
        from vllm.distributed.kv_transfer.kv_connector.v1.base import (
            KVConnectorRole,
        )

        from kvoffload.integrations.vllm.connector import KVOffloadConnector

        extra = {"cpu_bytes_to_use": 1, "blocks_per_chunk": PER_CHUNK, **extra}
        config = vllm_config(extra, prefix_caching, mm_processor_cache_gb)
        kv_config = kv_cache_config()
        settings = KVOffloadSettings.from_extra_config(extra)
        self.shape = EngineShape.from_vllm(config, kv_config, settings, False)
        geometry = self.shape.pool_geometry()
        extra["cpu_bytes_to_use"] = HOST_SLOTS * geometry.slot_nbytes
        config.kv_transfer_config.kv_connector_extra_config = extra
        # The worker's host pool, which secondary tiers read and write.
        self._worker: TransferWorker | None = None
        if kv_cache is None:
            self.pool = HostPool.create(
                geometry, HOST_SLOTS, name=self.shape.pool_name(0)
            )
        else:
            _, self.pool, self._worker = create_data_plane(
                {"l0": kv_cache},
                [WorkerGroupSpec(0, ("l0",), kv_config.num_blocks, PER_CHUNK)],
                extra["cpu_bytes_to_use"],
                pool_name=self.shape.pool_name(0),
            )
        try:
            self.connector = KVOffloadConnector(
                config, KVConnectorRole.SCHEDULER, kv_config
            )
        except BaseException:
            self._close_worker()
            raise
        self._next_block = 1  # block 0 is vLLM's null block
        self._stats: dict[str, float] = {}

    def _close_worker(self) -> None:
        try:
            if self._worker is not None:
                self._worker.shutdown()
        finally:
            self.pool.close()

    def close(self) -> None:
        try:
            self.connector.shutdown()
        finally:
            self._close_worker()

    def lookup(self, req: Any) -> int | None:
        """`get_num_new_matched_tokens` with no engine hit; `None`: deferred."""
        found, _ = self.connector.get_num_new_matched_tokens(req, 0)
        return found

    def allocate(self, req: Any, external_tokens: int) -> list[int]:
        """Blocks for the whole prompt; plans the load of `external_tokens`."""
        n = -(-req.num_prompt_tokens // BLOCK)
        ids = list(range(self._next_block, self._next_block + n))
        self._next_block += n
        blocks = SimpleNamespace(get_block_ids=lambda: (ids,))
        self.connector.update_state_after_alloc(req, blocks, external_tokens)
        return ids

    def allocate_more(self, req: Any, ids: list[int]) -> list[int]:
        """A streaming-input session's next input: its blocks `ids` and blocks for
        the rest of its prompt, none loaded (vLLM asks no lookup of a request
        with computed tokens)."""
        n = -(-req.num_prompt_tokens // BLOCK) - len(ids)
        ids = ids + list(range(self._next_block, self._next_block + n))
        self._next_block += n
        blocks = SimpleNamespace(get_block_ids=lambda: (ids,))
        self.connector.update_state_after_alloc(req, blocks, 0)
        return ids

    def step(
        self,
        new: Mapping[str, tuple[list[int], int]] | None = None,
        computed: Mapping[str, int] | None = None,
    ) -> StepPlan:
        """One engine step: `new` maps request ids to (blocks, tokens) scheduled
        from token 0, or from `computed[id]` (a streaming-input session's next
        input); the workers finish every job of the step at once."""
        new, computed = new or {}, computed or {}
        output = SimpleNamespace(
            scheduled_new_reqs=[
                SimpleNamespace(
                    req_id=r, num_computed_tokens=computed.get(r, 0), block_ids=(ids,)
                )
                for r, (ids, _) in new.items()
            ],
            num_scheduled_tokens={r: n for r, (_, n) in new.items()},
            scheduled_cached_reqs=SimpleNamespace(
                req_ids=[], new_block_ids=[], num_computed_tokens=[]
            ),
            preempted_req_ids=set(),
        )
        meta = self.connector.build_connector_meta(output)
        assert isinstance(meta, KVOffloadMetadata)
        self.report(meta.plan)
        return meta.plan

    def report(self, plan: StepPlan) -> None:
        """The workers' results for `plan`'s jobs (all succeeded), then stats."""
        jobs = (*plan.loads, *plan.stores)
        results = [JobResult(j.job_id, True, JOB_BYTES, JOB_SECONDS) for j in jobs]
        meta = KVOffloadWorkerMetadata({0: results}) if results else None
        self.connector.update_connector_output(
            SimpleNamespace(kv_connector_worker_meta=meta)
        )
        stats = self.connector.get_kv_connector_stats()
        assert stats is not None
        for key, value in stats.data.items():
            self._stats[key] = self._stats.get(key, 0) + value

    def compute(self, req: Any) -> None:
        """Schedule `req`'s whole prompt (its stores finish with the step), then
        finish it."""
        found = self.lookup(req)
        ids = self.allocate(req, found or 0)
        self.step({req.request_id: (ids, req.num_prompt_tokens)})
        self.connector.request_finished(req, ids)

    def idle(self, timeout_s: float = 10.0) -> int:
        """Step with no request while the connector asks vLLM to keep stepping
        (`has_pending_push_work`); returns the number of steps."""
        steps = 0
        deadline = time.monotonic() + timeout_s
        while self.connector.has_pending_push_work():
            assert time.monotonic() < deadline, "pending work did not finish"
            self.step()
            steps += 1
            time.sleep(0.001)
        return steps

    def counter(self, key: str) -> float:
        """A counter's total over every step so far (`tier.metric`)."""
        return self._stats.get(key, 0)


@contextmanager
def stand_in(
    extra: Mapping[str, Any] | None = None,
    prefix_caching: bool = True,
    kv_cache: Any = None,
    mm_processor_cache_gb: float | None = None,
) -> Iterator[SchedulerStandIn]:
    engine = SchedulerStandIn(
        extra or {}, prefix_caching, kv_cache, mm_processor_cache_gb
    )
    try:
        yield engine
    finally:
        engine.close()
