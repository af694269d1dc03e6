"""The LoRA adapter in every key: adapters that share a name but not their files
never share chunks; one adapter keys alike in every engine; no adapter keys as
before LoRA was identified by more than its name."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kvoffload.integrations.vllm.lora_identity import LoraIdentities
from kvoffload.integrations.vllm.requests import VllmRequestView
from kvoffload.keys import BlockHasher

lora_request = pytest.importorskip("vllm.lora.request", reason="vLLM is not installed")

TOKENS = list(range(8))
# The last block hash of TOKENS for model "m" without LoRA, as computed before
# adapters were identified by their files: tiers written then stay valid.
NO_LORA = "9f422da9162363deea13b69390017da10d57b2850eeae86bcb7cbcd829bb69f6"


def adapter(path: Path, weights: bytes | None = None, rank: int = 8) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_model.safetensors").write_bytes(weights or os.urandom(8192))
    (path / "adapter_config.json").write_text(f'{{"r": {rank}, "lora_alpha": 16}}')
    return path


def lora(name: str, path: Path | str, int_id: int = 1, **kw: Any) -> Any:
    return lora_request.LoRARequest(name, int_id, str(path), **kw)


def keys(req_lora: Any, loras: LoraIdentities | None = None) -> list[bytes]:
    request = SimpleNamespace(
        request_id="r",
        all_token_ids=TOKENS,
        num_tokens=len(TOKENS),
        lora_request=req_lora,
        cache_salt=None,
    )
    view = VllmRequestView(
        request, BlockHasher(4), "m", loras if loras is not None else LoraIdentities()
    )
    return list(view.block_hashes)


def test_same_name_different_adapters_do_not_share_keys(tmp_path: Path) -> None:
    a = adapter(tmp_path / "a")
    b = adapter(tmp_path / "b")
    copy = adapter(tmp_path / "copy", (a / "adapter_model.safetensors").read_bytes())
    assert keys(lora("sql", a)) != keys(lora("sql", b))
    # Same weights, another path: a different deployment, as for base models.
    assert keys(lora("sql", a)) != keys(lora("sql", copy))
    assert keys(lora("sql", a)) != keys(lora("chat", a))


def test_an_adapter_retrained_at_the_same_path_changes_its_keys(
    tmp_path: Path,
) -> None:
    path = adapter(tmp_path / "sql")
    before = keys(lora("sql", path))  # another engine, before the retraining
    adapter(path)
    retrained = keys(lora("sql", path))
    assert retrained != before
    # Same weights, another rank or alpha: other KV too.
    adapter(path, (path / "adapter_model.safetensors").read_bytes(), rank=16)
    assert keys(lora("sql", path)) != retrained


def test_one_adapter_keys_alike_in_two_engines(tmp_path: Path) -> None:
    path = adapter(tmp_path / "sql")
    # The int id is local to an engine: it does not enter the keys.
    assert keys(lora("sql", path, 1), LoraIdentities()) == keys(
        lora("sql", path, 7), LoraIdentities()
    )


def test_an_engine_reads_an_adapter_once_per_id(tmp_path: Path) -> None:
    """vLLM keeps serving a loaded id from memory, so its keys stay; a new id (or
    `load_inplace`) makes vLLM read the new files, and the keys follow them."""
    path = adapter(tmp_path / "sql")
    loras = LoraIdentities()
    first = keys(lora("sql", path, 1), loras)
    adapter(path)  # retrained in place
    assert keys(lora("sql", path, 1), loras) == first
    reloaded = keys(lora("sql", path, 2), loras)
    assert reloaded != first
    assert keys(lora("sql", path, 2), LoraIdentities()) == reloaded
    adapter(path)
    assert keys(lora("sql", path, 2, load_inplace=True), loras) != reloaded


def test_no_adapter_keys_as_before() -> None:
    assert keys(None)[-1].hex() == NO_LORA


def test_an_unreadable_adapter_is_named_by_name_and_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    loras = LoraIdentities()
    with caplog.at_level(logging.WARNING):
        hub = keys(lora("sql", "org/sql-lora"), loras)
        assert keys(lora("sql", "org/sql-lora"), loras) == hub
    assert len(caplog.records) == 1 and "org/sql-lora" in caplog.records[0].getMessage()
    assert hub != keys(lora("sql", "org/other-lora"))
    assert hub != keys(lora("chat", "org/sql-lora"))
    assert hub[-1].hex() != NO_LORA
