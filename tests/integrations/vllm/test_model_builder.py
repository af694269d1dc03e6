"""The local model builder: validated specs, cached atomic builds, and real vLLM.

The builder tests use a micro spec in a temporary directory (about a second each);
the `vllm` tests load the cached tiny models in vLLM's CPU platform.
"""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kvoffload.integrations.vllm.model_builder import (
    MARKER_FILE,
    ModelSpec,
    build_model,
    synthetic_text,
)

MICRO = ModelSpec(
    name="micro",
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    intermediate_size=128,
    vocab_size=600,
    max_position_embeddings=512,
    tokenizer_corpus_words=20_000,
)


@pytest.fixture(scope="module")
def builder_deps() -> None:
    pytest.importorskip("transformers", reason="transformers builds test models")
    pytest.importorskip("tokenizers", reason="tokenizers builds test models")


def _digests(path: Path) -> dict[str, str]:
    return {
        f.name: hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(path.iterdir())
    }


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"hidden_size": 0}, "hidden_size"),
        ({"hidden_size": 100, "num_attention_heads": 3}, "hidden_size"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"dtype": "float16"}, "dtype"),
        ({"vocab_size": 10}, "vocab_size"),
        ({"name": "a/b"}, "name"),
        ({"layer_types": ("full_attention",)}, "layer_types"),
        ({"layer_types": ("sliding_attention",) * 4}, "sliding_window"),
    ],
)
def test_spec_rejects_bad_values_naming_the_field(
    change: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValueError, match=field):
        replace(ModelSpec(), **change)


def test_cache_key_names_the_model_and_covers_every_parameter() -> None:
    key = MICRO.cache_key()
    assert key.startswith("micro-")
    assert key == replace(MICRO).cache_key()
    assert key != replace(MICRO, seed=1).cache_key()
    assert key != replace(MICRO, dtype="bfloat16").cache_key()


def test_build_writes_a_checkpoint_transformers_loads(
    builder_deps: None, tmp_path: Path
) -> None:
    from transformers import AutoConfig, AutoTokenizer

    built = build_model(MICRO, tmp_path)

    assert built.path == tmp_path / MICRO.cache_key()
    assert built.vllm_args() == {
        "model": str(built.path),
        "tokenizer": str(built.path),
        "dtype": "float32",
    }
    marker = json.loads((built.path / MARKER_FILE).read_text())
    assert marker["spec"]["name"] == "micro"
    tokenizer = AutoTokenizer.from_pretrained(built.path)
    text = synthetic_text(40, seed=3)
    ids = tokenizer(text).input_ids
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    config = AutoConfig.from_pretrained(built.path)
    assert config.vocab_size == len(tokenizer)
    assert (config.hidden_size, config.num_hidden_layers) == (64, 2)
    assert config.num_key_value_heads == 1
    assert config.max_position_embeddings == 512
    assert config.eos_token_id == tokenizer.eos_token_id


def test_second_build_reuses_the_cached_directory(
    builder_deps: None, tmp_path: Path
) -> None:
    first = build_model(MICRO, tmp_path)
    weights = first.path / "model.safetensors"
    written = weights.stat().st_mtime_ns

    assert build_model(MICRO, tmp_path) == first
    assert weights.stat().st_mtime_ns == written


def test_same_spec_builds_identical_bytes(builder_deps: None, tmp_path: Path) -> None:
    one = build_model(MICRO, tmp_path / "one")
    two = build_model(MICRO, tmp_path / "two")

    assert _digests(one.path) == _digests(two.path)


def test_concurrent_builders_publish_one_complete_directory(
    builder_deps: None, tmp_path: Path
) -> None:
    """Scenario: three test workers ask for the same uncached model at once."""
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda _: build_model(MICRO, tmp_path), range(3)))

    assert len({r.path for r in results}) == 1
    assert (results[0].path / MARKER_FILE).is_file()
    assert not list(tmp_path.glob(".tmp-*"))


def test_debris_of_a_killed_build_is_replaced(
    builder_deps: None, tmp_path: Path
) -> None:
    """Scenario: a builder died mid-write, leaving its temporary directory."""
    key = MICRO.cache_key()
    (tmp_path / f".tmp-{key}-dead").mkdir()
    (tmp_path / key).mkdir()  # no marker: not a complete build

    built = build_model(MICRO, tmp_path)

    assert (built.path / MARKER_FILE).is_file()
    assert not list(tmp_path.glob(".tmp-*"))


@pytest.mark.vllm
def test_tiny_model_generates_greedily_and_deterministically_in_vllm(
    tiny_model: Any, llm_factory: Any
) -> None:
    """Scenario: the same prompt twice; the second run hits the prefix cache.

    A prefix-cache hit and a full prefill must give the same greedy tokens: the
    offloading tests compare exactly these two paths.
    """
    from vllm import SamplingParams

    llm = llm_factory(**tiny_model.vllm_args(), kv_cache_memory_bytes=64 << 20)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompt = synthetic_text(300, seed=11)

    first, second = (llm.generate([prompt], params)[0] for _ in range(2))

    assert len(first.outputs[0].token_ids) == 16
    assert list(second.outputs[0].token_ids) == list(first.outputs[0].token_ids)
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens > 0


@pytest.mark.vllm
def test_hybrid_model_gives_two_kv_cache_groups_in_vllm(
    tiny_hybrid_model: Any, llm_factory: Any
) -> None:
    llm = llm_factory(**tiny_hybrid_model.vllm_args(), kv_cache_memory_bytes=64 << 20)
    # In-process engine core (VLLM_ENABLE_V1_MULTIPROCESSING=0).
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    groups = scheduler.kv_cache_config.kv_cache_groups
    kinds = sorted(type(group.kv_cache_spec).__name__ for group in groups)

    assert kinds == ["FullAttentionSpec", "SlidingWindowSpec"]
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompt = synthetic_text(300, seed=12)
    outputs = [llm.generate([prompt], params)[0].outputs[0].token_ids for _ in "ab"]
    assert list(outputs[0]) == list(outputs[1])
