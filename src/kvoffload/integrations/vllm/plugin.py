"""vLLM plugin: kvoffload's settings checked as soon as vLLM has them, in seconds.

The connector checks its settings when vLLM creates it, which is after the model
has loaded and the KV cache been sized: minutes into start-up on a GPU with a
real model. vLLM 0.32 has no hook that hands a plugin its config, but it loads
the `vllm.general_plugins` entry points (pyproject.toml names `register`) in
every process, first while it builds its argument parser (`AsyncEngineArgs.
add_cli_args`; for `LLM(...)`, in `EngineArgs.__post_init__`), before any engine
process or model exists. `register` then wraps `EngineArgs.create_engine_config`,
the step that turns the parsed arguments, or `LLM`'s, into vLLM's config, with the
connector's own check (`check_transfer_config`): a bad key stops vLLM there, with
every error and a suggestion for a mistyped key, before the engine starts.

Without the plugin (another vLLM version, `VLLM_PLUGINS` naming others only)
nothing changes but the time: the connector's check still stops the engine.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable, Mapping
from typing import Any

logger = logging.getLogger(__name__)

_ARG_UTILS = "vllm.engine.arg_utils"
_FIELDS = (
    "kv_connector",
    "kv_connector_module_path",
    "kv_role",
    "kv_connector_extra_config",
)


def transfer_mapping(transfer: object) -> Mapping[str, Any] | None:
    """vLLM's `kv_transfer_config` (a `KVTransferConfig`, or a dict given to
    `EngineArgs`) as a mapping of the fields that select and configure a
    connector; None if there is none."""
    if transfer is None:
        return None
    if isinstance(transfer, Mapping):
        return transfer
    return {name: getattr(transfer, name, None) for name in _FIELDS}


def check_engine_args(engine_args: object) -> None:
    """The check `register` adds: kvoffload's settings in `engine_args`, if it
    selects kvoffload; a `ConfigError` (a `ValueError`) with every error."""
    # Imported here: vLLM loads the plugin in every process, kvoffload in use or not.
    from kvoffload.integrations.vllm.check import check_transfer_config

    transfer = transfer_mapping(getattr(engine_args, "kv_transfer_config", None))
    if transfer is not None:
        for where, _ in check_transfer_config(transfer):
            logger.debug("kvoffload: %skv_connector_extra_config checked", where)


def register() -> None:
    """The `vllm.general_plugins` entry point: wraps `create_engine_config`
    once per process. Only where vLLM's argument handling is loaded (the
    process that parses arguments or builds `LLM`), not in engine and worker
    processes, which never call it."""
    arg_utils = sys.modules.get(_ARG_UTILS)
    engine_args = getattr(arg_utils, "EngineArgs", None)
    create = getattr(engine_args, "create_engine_config", None)
    if create is None or getattr(create, "__kvoffload_checked__", False):
        return
    assert engine_args is not None
    engine_args.create_engine_config = _checked(create)


def _checked(create: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(create)
    def create_engine_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        check_engine_args(self)
        return create(self, *args, **kwargs)

    create_engine_config.__kvoffload_checked__ = True  # type: ignore[attr-defined]
    return create_engine_config
