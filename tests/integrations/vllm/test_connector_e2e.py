"""kvoffload inside real vLLM (CPU platform), end to end.

The scenario throughout: request A, then unrelated requests that evict A from the
device cache (16 usable blocks of 128 tokens), then A again. Outputs are greedy
and compared token by token with a run without any connector.
"""

from __future__ import annotations

import logging
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvoffload.integrations.vllm.model_builder import BuiltModel, synthetic_text
from kvoffload.tiers.secondary.redis_server import RedisServer, find_redis_server
from kvoffload.worker import HostPool

from .conftest import LLMFactory

pytestmark = pytest.mark.vllm

BLOCK = 128
PAGE = 4 * 131072  # one block of all four layers of the tiny model, float32
DEVICE = {"kv_cache_memory_bytes": 17 * PAGE, "max_num_batched_tokens": 2048}
A = synthetic_text(250, seed=1)  # 347 tokens: two whole chunks and a tail
FILLERS = [synthetic_text(240, seed=10 + i) for i in range(8)]


def kv_config(engine_id: str | None = None, **extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "kv_connector": "KVOffloadConnector",
        "kv_connector_module_path": "kvoffload.integrations.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes_to_use": "32MiB", **extra},
    }
    if engine_id is not None:
        config["engine_id"] = engine_id
    return config


def sampling(max_tokens: int = 8, params: dict[str, Any] | None = None) -> Any:
    from vllm import SamplingParams

    extra = {"kv_transfer_params": params} if params is not None else None
    return SamplingParams(
        temperature=0, max_tokens=max_tokens, ignore_eos=True, extra_args=extra
    )


def run(
    llm: Any, prompt: str, max_tokens: int = 8, params: dict[str, Any] | None = None
) -> Any:
    return llm.generate([prompt], sampling(max_tokens, params), use_tqdm=False)[0]


def evict(llm: Any) -> None:
    for prompt in FILLERS:
        run(llm, prompt)


def tokens(output: Any) -> list[int]:
    return list(output.outputs[0].token_ids)


@pytest.fixture(scope="module")
def reference(tiny_model: BuiltModel, vllm_in_process: None) -> list[int]:
    """A's greedy output without any connector."""
    from vllm import LLM

    llm = LLM(
        **tiny_model.vllm_args(),
        enforce_eager=True,
        max_model_len=2048,
        seed=0,
        **DEVICE,
    )
    try:
        first = run(llm, A)
        evict(llm)
        again = run(llm, A)
        assert again.num_cached_tokens == 0, (
            "without kvoffload nothing survives the fillers"
        )
        assert tokens(first) == tokens(again)
        return tokens(first)
    finally:
        llm.llm_engine.engine_core.shutdown()


def make(llm_factory: LLMFactory, model: BuiltModel, **kwargs: Any) -> Any:
    return llm_factory(**model.vllm_args(), **DEVICE, **kwargs)


@dataclass(frozen=True)
class HostMemoryRun:
    """A, the fillers and A again through kvoffload with host memory only."""

    first: Any
    again: Any
    metrics: dict[tuple[str, str | None], Any]
    """vLLM's metrics afterwards, by name and tier."""


@pytest.fixture(scope="module")
def host_memory_run(tiny_model: BuiltModel, vllm_in_process: None) -> HostMemoryRun:
    """One engine plays the scenario for the tests that check what it leaves
    (an engine start and the scenario are most of such a test's time)."""
    from vllm import LLM

    llm = LLM(
        **tiny_model.vllm_args(),
        enforce_eager=True,
        max_model_len=2048,
        disable_log_stats=False,
        seed=0,
        kv_transfer_config=kv_config(),
        **DEVICE,
    )
    try:
        first = run(llm, A)
        evict(llm)
        again = run(llm, A)
        metrics = {(m.name, m.labels.get("tier")): m for m in llm.get_metrics()}
        return HostMemoryRun(first, again, metrics)
    finally:
        llm.llm_engine.engine_core.shutdown()


def test_a_evicted_prefix_comes_back_from_host_memory(
    host_memory_run: HostMemoryRun, reference: list[int]
) -> None:
    first, again = host_memory_run.first, host_memory_run.again
    assert first.num_cached_tokens == 0
    assert again.num_cached_tokens == 2 * BLOCK
    assert tokens(first) == tokens(again) == reference


def test_corrupted_host_bytes_change_the_output(
    llm_factory: LLMFactory, tiny_model: BuiltModel, reference: list[int]
) -> None:
    """Negative control: the loaded bytes are what the engine computes with."""
    engine_id = f"test-{uuid.uuid4().hex[:8]}"
    llm = make(llm_factory, tiny_model, kv_transfer_config=kv_config(engine_id))
    run(llm, A)
    evict(llm)
    pool = HostPool.attach(f"kvoffload-{engine_id}-r0")
    try:
        pool.array[:] = np.random.default_rng(0).integers(
            0, 255, pool.array.shape, np.uint8
        )
    finally:
        pool.close()
    again = run(llm, A)
    assert again.num_cached_tokens == 2 * BLOCK
    assert tokens(again) != reference


def test_file_tier_serves_a_new_engine_on_the_same_directory(
    llm_factory: LLMFactory,
    tiny_model: BuiltModel,
    reference: list[int],
    tmp_path: Path,
) -> None:
    tiers = [{"type": "file", "path": str(tmp_path / "kv"), "capacity": "64MiB"}]
    first_engine = make(
        llm_factory, tiny_model, kv_transfer_config=kv_config(secondary_tiers=tiers)
    )
    run(first_engine, A)
    evict(first_engine)  # steps enough for A's chunks to reach the disk
    first_engine.llm_engine.engine_core.shutdown()
    assert any((tmp_path / "kv").rglob("*.kvc")), "chunk files were written"

    restarted = make(
        llm_factory, tiny_model, kv_transfer_config=kv_config(secondary_tiers=tiers)
    )
    again = run(restarted, A)
    assert again.num_cached_tokens == 2 * BLOCK
    assert tokens(again) == reference


def test_file_tier_does_not_serve_weights_replaced_at_the_same_path(
    llm_factory: LLMFactory,
    tiny_model: BuiltModel,
    reference: list[int],
    tmp_path: Path,
) -> None:
    """A new checkpoint written over the old one, same path, config and size: the
    chunks the old weights left on disk are a miss, never the new model's KV."""
    from safetensors.torch import load_file, save_file

    model = BuiltModel(tmp_path / "model", tiny_model.spec)
    shutil.copytree(tiny_model.path, model.path)
    tiers = [{"type": "file", "path": str(tmp_path / "kv"), "capacity": "64MiB"}]
    old = make(llm_factory, model, kv_transfer_config=kv_config(secondary_tiers=tiers))
    run(old, A)
    evict(old)  # A's chunks reach the disk
    old.llm_engine.engine_core.shutdown()

    weights = model.path / "model.safetensors"
    tensors = load_file(weights)
    save_file({name: t.flip(0).contiguous() for name, t in tensors.items()}, weights)
    new = make(llm_factory, model, kv_transfer_config=kv_config(secondary_tiers=tiers))
    again = run(new, A)
    assert again.num_cached_tokens == 0, "old weights' KV must not be loaded"
    assert tokens(again) != reference, "the new weights give another answer"
    evict(new)
    assert run(new, A).num_cached_tokens == 2 * BLOCK, "its own chunks still hit"


@pytest.fixture
def redis_url(tmp_path: Path) -> Any:
    if find_redis_server() is None:
        pytest.skip(
            "redis-server not found (Debian package redis-server; `make test` installs it)"
        )
    with RedisServer(str(tmp_path)) as server:
        yield server.url


def test_redis_tier_serves_a_prefix_evicted_from_host_memory(
    llm_factory: LLMFactory,
    tiny_model: BuiltModel,
    reference: list[int],
    redis_url: str,
) -> None:
    """Host memory holds only 4 chunks: the fillers evict A there too, and A
    comes back from Redis (promoted into host memory, then loaded)."""
    config = kv_config(
        secondary_tiers=[{"type": "redis", "url": redis_url}], cpu_bytes_to_use=4 * PAGE
    )
    llm = make(llm_factory, tiny_model, kv_transfer_config=config)
    run(llm, A)
    evict(llm)
    again = run(llm, A)
    assert again.num_cached_tokens == 2 * BLOCK
    assert tokens(again) == reference


def test_max_offload_tokens_through_kv_transfer_params(
    llm_factory: LLMFactory, tiny_model: BuiltModel, caplog: pytest.LogCaptureFixture
) -> None:
    """One engine, one prompt per value (A behind a word of its own, so no two
    share a chunk): what the return hits, and whether the value was warned
    about and ignored."""
    llm = make(llm_factory, tiny_model, kv_transfer_config=kv_config())
    cases: list[tuple[object, int, bool]] = [
        (BLOCK, BLOCK, False),
        (0, 0, False),
        ("128", 2 * BLOCK, True),
        (-5, 2 * BLOCK, True),
    ]
    seen = []
    # The connector sends kvoffload's records to vLLM's handlers, not the root's.
    ours = logging.getLogger("kvoffload")
    ours.addHandler(caplog.handler)
    try:
        for i, (value, _, _) in enumerate(cases):
            prompt = f"case{i} {A}"
            caplog.clear()
            first = run(llm, prompt, params={"max_offload_tokens": value})
            records = caplog.records
            warned = any("max_offload_tokens" in r.getMessage() for r in records)
            evict(llm)
            again = run(llm, prompt)
            assert tokens(again) == tokens(first)
            seen.append((value, again.num_cached_tokens, warned))
    finally:
        ours.removeHandler(caplog.handler)
    assert seen == cases


def _stored_chunks(llm: Any) -> float:
    return sum(
        metric.value
        for metric in llm.get_metrics()
        if metric.name == "vllm:kvoffload_chunks_stored"
        and metric.labels.get("tier") == "cpu"
    )


@pytest.mark.parametrize(("prompt_only", "expected"), [(True, 2), (False, 4)])
def test_offload_prompt_only(
    llm_factory: LLMFactory, tiny_model: BuiltModel, prompt_only: bool, expected: int
) -> None:
    """A's 347-token prompt fills 2 chunks; with 170 generated tokens the KV of
    516 tokens is computed: 4 chunks."""
    llm = make(
        llm_factory,
        tiny_model,
        kv_transfer_config=kv_config(offload_prompt_only=prompt_only),
    )
    run(llm, A, max_tokens=170)
    run(
        llm, "hello", max_tokens=1
    )  # more steps deliver the last results; stores nothing
    assert _stored_chunks(llm) == expected


def test_unknown_config_key_stops_start_up(
    llm_factory: LLMFactory, tiny_model: BuiltModel
) -> None:
    with pytest.raises(
        ValueError,
        match=r"unknown key 'cpu_bytes' \(did you mean 'cpu_bytes_to_use'\?\)",
    ):
        make(llm_factory, tiny_model, kv_transfer_config=kv_config(cpu_bytes="1GiB"))


def test_stats_reach_vllm_metrics(host_memory_run: HostMemoryRun) -> None:
    metrics = host_memory_run.metrics
    assert metrics[("vllm:kvoffload_hit_tokens", "connector")].value == 2 * BLOCK
    assert metrics[("vllm:kvoffload_chunks_loaded", "cpu")].value == 2
    assert metrics[("vllm:kvoffload_chunks_stored", "cpu")].value >= 2
    assert metrics[("vllm:kvoffload_capacity", "cpu")].value == 32 * 2**20 // PAGE


def test_hybrid_model_with_two_kv_cache_groups(
    llm_factory: LLMFactory, tiny_hybrid_model: BuiltModel
) -> None:
    """Sliding-window and full-attention groups; the window's null blocks are
    never touched, and the output matches a run without the connector."""
    plain = make(llm_factory, tiny_hybrid_model)
    expected = tokens(run(plain, A))
    plain.llm_engine.engine_core.shutdown()
    llm = make(llm_factory, tiny_hybrid_model, kv_transfer_config=kv_config())
    first = run(llm, A)
    evict(llm)
    again = run(llm, A)
    assert tokens(first) == tokens(again) == expected
    assert again.num_cached_tokens == 2 * BLOCK


def test_a_failed_load_recomputes_and_serving_continues(
    llm_factory: LLMFactory,
    tiny_model: BuiltModel,
    reference: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every host-to-device copy fails: A is recomputed (same output, no error),
    once, and the engine keeps serving."""
    from kvoffload.worker import JobResult, TransferDirection
    from kvoffload.worker.cpu_worker import CpuTransferWorker

    original = CpuTransferWorker._execute
    failures: list[int] = []

    def failing(self: CpuTransferWorker, job: Any, ticket: object) -> Any:
        if job.direction is TransferDirection.LOAD:
            failures.append(job.job_id)
            return JobResult(job.job_id, success=False)
        return original(self, job, ticket)

    monkeypatch.setattr(CpuTransferWorker, "_execute", failing)
    llm = make(llm_factory, tiny_model, kv_transfer_config=kv_config())
    run(llm, A)
    evict(llm)
    again = run(llm, A)
    assert again.outputs[0].finish_reason == "length"
    assert tokens(again) == reference
    assert len(failures) == 1, "the failed load is not retried"
    fresh = run(llm, synthetic_text(240, seed=99))  # nothing to load: unaffected
    assert fresh.outputs[0].finish_reason == "length" and len(failures) == 1
