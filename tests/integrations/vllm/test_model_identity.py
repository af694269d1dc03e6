"""The model identity in every key: what changes the KV must change it, what does
not must not (engines that share a tier share chunks only when it is equal)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kvoffload.integrations.vllm.model_identity import (
    SAMPLE_BYTES,
    SAMPLES_PER_FILE,
    model_identity,
)

transformers = pytest.importorskip(
    "transformers", reason="transformers is needed for a real model config"
)

WEIGHTS = 4 * SAMPLES_PER_FILE * SAMPLE_BYTES  # samples cover a quarter of it


def hf_config(**overrides: Any) -> Any:
    options: dict[str, Any] = {
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 512,
    }
    options.update(overrides)
    return transformers.LlamaConfig(**options)


def engine(model: str | Path, config: Any = None, **cache: Any) -> Any:
    """The parts of a `VllmConfig` the identity reads."""
    return SimpleNamespace(
        model_config=SimpleNamespace(
            model=str(model),
            revision=None,
            quantization=None,
            hf_config=config if config is not None else hf_config(),
        ),
        cache_config=SimpleNamespace(cache_dtype=cache.get("cache_dtype", "auto")),
    )


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    path = tmp_path / "model"
    path.mkdir()
    (path / "model.safetensors").write_bytes(os.urandom(WEIGHTS))
    (path / "tokenizer.json").write_text("{}")
    return path


def test_the_same_model_read_again_is_the_same_identity(
    model_dir: Path, tmp_path: Path
) -> None:
    config = hf_config()
    config.save_pretrained(tmp_path / "saved")
    # Read back, it records where it came from: that must not matter.
    reread = transformers.AutoConfig.from_pretrained(tmp_path / "saved")
    assert model_identity(engine(model_dir, config)) == model_identity(
        engine(model_dir, reread)
    )


def test_weights_replaced_at_the_same_path_change_it(model_dir: Path) -> None:
    before = model_identity(engine(model_dir))
    weights = model_dir / "model.safetensors"
    data = bytearray(weights.read_bytes())
    # A new checkpoint of the same size: bytes change all over the file.
    for offset in range(0, len(data), len(data) // 64):
        data[offset : offset + 64] = os.urandom(64)
    weights.write_bytes(bytes(data))
    assert model_identity(engine(model_dir)) != before


def test_files_that_are_not_weights_do_not_change_it(model_dir: Path) -> None:
    before = model_identity(engine(model_dir))
    (model_dir / "tokenizer.json").write_text('{"changed": true}')
    (model_dir / "README.md").write_text("notes")
    assert model_identity(engine(model_dir)) == before


def test_config_overrides_and_kv_cache_dtype_change_it(model_dir: Path) -> None:
    base = model_identity(engine(model_dir))
    rope = model_identity(
        engine(
            model_dir, hf_config(rope_scaling={"rope_type": "linear", "factor": 2.0})
        )
    )
    e4m3 = model_identity(engine(model_dir, cache_dtype="fp8_e4m3"))
    e5m2 = model_identity(engine(model_dir, cache_dtype="fp8_e5m2"))
    assert len({base, rope, e4m3, e5m2}) == 4


def test_a_model_tag_names_the_weights_instead_of_their_path(
    model_dir: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "elsewhere"
    shutil.copytree(model_dir, copy)
    assert model_identity(engine(model_dir)) != model_identity(engine(copy))
    tagged = model_identity(engine(model_dir), model_tag="llama-ft-v3")
    assert tagged == model_identity(engine(copy), model_tag="llama-ft-v3")
    assert tagged != model_identity(engine(copy), model_tag="llama-ft-v4")


def test_a_hub_model_is_named_by_the_commit_it_resolved_to() -> None:
    v1, v2 = hf_config(), hf_config()
    v1._commit_hash = "a" * 40
    v2._commit_hash = "b" * 40
    assert model_identity(engine("org/model", v1)) != model_identity(
        engine("org/model", v2)
    )


def test_a_worker_shape_names_no_chunks() -> None:
    """Workers skip the identity (no weight reads); nothing may then name a chunk
    with the empty model in its place."""
    from kvoffload.integrations.vllm.engine_shape import (
        UNIDENTIFIED,
        EngineShape,
        GroupShape,
    )

    group = GroupShape(0, 16, 2, ("l0", "l1"), 2048, "FullAttentionSpec")
    worker = EngineShape((group,), 64, 16, UNIDENTIFIED, "float16", 1, "e")
    for fingerprint in (
        worker.model_fingerprint,
        worker.tiers_fingerprint,
        lambda: worker.chunk_fingerprint(0),
    ):
        with pytest.raises(RuntimeError, match="names no model"):
            fingerprint()
    assert worker.pool_name(0) == "kvoffload-e-r0", "what a worker needs still works"
    named = EngineShape((group,), 64, 16, "tiny@", "float16", 1, "e")
    assert named.model_fingerprint() != ""
