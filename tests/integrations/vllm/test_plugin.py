"""The vLLM plugin checks kvoffload's settings when vLLM builds its config from
the parsed arguments, before any engine process or model exists."""

from __future__ import annotations

import importlib
import sys
import tomllib
import types
from pathlib import Path
from typing import Any

import pytest

from kvoffload.config import ConfigError
from kvoffload.integrations.vllm import plugin

ROOT = Path(__file__).resolve().parents[3]
TYPO = {"cpu_bytes_to_use": "64MiB", "evicton_policy": "arc"}


def transfer(extra: dict[str, Any], connector: str = "KVOffloadConnector") -> Any:
    return {
        "kv_connector": connector,
        "kv_connector_module_path": "kvoffload.integrations.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra,
    }


def test_pyproject_declares_the_plugin_entry_point() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    target = project["entry-points"]["vllm.general_plugins"]["kvoffload"]
    module, _, name = target.partition(":")
    assert getattr(importlib.import_module(module), name) is plugin.register


@pytest.fixture
def fake_arg_utils(monkeypatch: pytest.MonkeyPatch) -> type:
    """A stand-in for `vllm.engine.arg_utils`, as loaded when vLLM loads its
    plugins: `create_engine_config` records that it ran."""

    class EngineArgs:
        created: list[object] = []  # noqa: RUF012

        def __init__(self, kv_transfer_config: Any) -> None:
            self.kv_transfer_config = kv_transfer_config

        def create_engine_config(self, usage_context: object = None) -> str:
            EngineArgs.created.append(usage_context)
            return "vllm config"

    module = types.ModuleType("vllm.engine.arg_utils")
    module.EngineArgs = EngineArgs  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm.engine.arg_utils", module)
    return EngineArgs


def test_a_typo_stops_vllm_before_it_builds_its_config(fake_arg_utils: Any) -> None:
    plugin.register()
    plugin.register()  # vLLM may load plugins again: still one check
    args = fake_arg_utils(transfer(TYPO))
    with pytest.raises(ConfigError, match=r"did you mean 'eviction_policy'\?"):
        args.create_engine_config("server")
    assert fake_arg_utils.created == [], "vLLM's own config was never built"


def test_other_configs_pass_through(fake_arg_utils: Any) -> None:
    plugin.register()
    good = transfer({"cpu_bytes_to_use": "64MiB"})
    assert fake_arg_utils(good).create_engine_config("a") == "vllm config"
    other = transfer(TYPO, connector="LMCacheConnectorV1")
    assert fake_arg_utils(other).create_engine_config("b") == "vllm config"
    assert fake_arg_utils(None).create_engine_config("c") == "vllm config"
    assert fake_arg_utils.created == ["a", "b", "c"]


def test_outside_the_process_that_parses_arguments_nothing_is_wrapped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Engine and worker processes load plugins too, without vLLM's argument
    handling: `register` imports nothing there."""
    monkeypatch.delitem(sys.modules, "vllm.engine.arg_utils", raising=False)
    plugin.register()
    assert "vllm.engine.arg_utils" not in sys.modules


@pytest.mark.vllm
def test_real_vllm_fails_on_the_typo_before_it_looks_at_the_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With vLLM's own `EngineArgs` (`LLM(...)` and the server build their
    config through it): the model path does not even exist, and the error is
    kvoffload's, so nothing of the model was read before it."""
    arg_utils = pytest.importorskip("vllm.engine.arg_utils")
    from vllm.config import KVTransferConfig

    engine_args = arg_utils.EngineArgs
    # Restored after the test: `register` replaces it on the class.
    monkeypatch.setattr(
        engine_args, "create_engine_config", engine_args.create_engine_config
    )
    plugin.register()
    args = engine_args(
        model="/nonexistent/model",
        kv_transfer_config=KVTransferConfig(**transfer(TYPO)),
    )
    with pytest.raises(ConfigError, match=r"did you mean 'eviction_policy'\?"):
        args.create_engine_config()
