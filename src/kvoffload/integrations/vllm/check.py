"""`kvoffload check-config`: kvoffload's vLLM configuration checked offline.

Takes `kv_connector_extra_config` or a whole `--kv-transfer-config`, as JSON text,
`-` (standard input) or a JSON or YAML file, or by default the file that
`KVOFFLOAD_CONFIG` names. Prints the configuration as the engine logs it at
start-up (secrets masked), or every error at once and exits 1. The checks are the
connector's own (`KVOffloadSettings.from_extra_config`), in this environment, so
`${NAME}` references and `KVOFFLOAD_CONFIG` resolve as they would in the engine's
if it is the same. No vLLM is needed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from kvoffload.config import ConfigError, messages_of, shown
from kvoffload.config.errors import ErrorList
from kvoffload.config.sources import CONFIG_FILE_ENV, CONFIG_FILE_KEY, read_config_file
from kvoffload.integrations.vllm.config import KVOffloadSettings
from kvoffload.integrations.vllm.describe import describe, probe_redis_tier
from kvoffload.tiers.secondary import parse_tier_config
from kvoffload.tiers.secondary.redis_config import RedisTierConfig
from kvoffload.tiers.secondary.redis_url import redact_url

CONNECTOR = "KVOffloadConnector"
MODULE = "kvoffload.integrations.vllm"
# Keys only a whole `kv_transfer_config` has: what tells one from an extra config.
_TRANSFER_KEYS = ("kv_connector", "kv_connector_extra_config", "kv_role")


def is_transfer_config(config: Mapping[str, Any]) -> bool:
    return any(key in config for key in _TRANSFER_KEYS)


def _is_ours(connector: Mapping[str, Any]) -> bool:
    module = connector.get("kv_connector_module_path")
    return (
        connector.get("kv_connector") == CONNECTOR
        and isinstance(module, str)
        and module.split(".")[0] == "kvoffload"
    )


def kvoffload_extra_configs(transfer: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """Where and what the `kv_connector_extra_config` of each kvoffload
    connector that `transfer` (a `kv_transfer_config`) selects is: its own, or
    those of vLLM's `MultiConnector` children. Empty if it selects none."""
    extra = transfer.get("kv_connector_extra_config")
    if _is_ours(transfer):
        return [("", {} if extra is None else extra)]
    if transfer.get("kv_connector") != "MultiConnector" or not isinstance(
        extra, Mapping
    ):
        return []
    found = []
    connectors = extra.get("connectors")
    for i, child in enumerate(connectors if isinstance(connectors, list) else []):
        if isinstance(child, Mapping) and _is_ours(child):
            child_extra = child.get("kv_connector_extra_config")
            found.append(
                (f"connectors[{i}]: ", {} if child_extra is None else child_extra)
            )
    return found


def check_transfer_config(
    transfer: Mapping[str, Any],
) -> list[tuple[str, KVOffloadSettings]]:
    """The settings of each kvoffload connector `transfer` selects; a
    `ConfigError` with every error of all of them."""
    errors = ErrorList()
    checked = []
    for where, extra in kvoffload_extra_configs(transfer):
        with errors.check(where):
            checked.append((where, KVOffloadSettings.from_extra_config(extra)))
    errors.raise_if_any()
    return checked


def _selection_errors(transfer: Mapping[str, Any]) -> list[str]:
    """What stops vLLM from starting kvoffload with `transfer` at all."""
    if kvoffload_extra_configs(transfer):
        errors = []
        if transfer.get("kv_role") is None:
            errors.append(
                "kv_role: not set; vLLM requires it with a connector: 'kv_both'"
            )
        return errors
    return [
        f"kv_connector: {shown(transfer.get('kv_connector'))} with "
        f"kv_connector_module_path {shown(transfer.get('kv_connector_module_path'))} "
        f"does not select kvoffload: give kv_connector {CONNECTOR!r} and "
        f"kv_connector_module_path {MODULE!r}"
    ]


def _read(source: str | None, stdin: TextIO) -> dict[str, Any]:
    """The `kv_transfer_config` or extra config that `source` gives, as the
    engine would see it (a file of settings as `{"config_file": path}`)."""
    if source is None:
        if not os.environ.get(CONFIG_FILE_ENV):
            raise ValueError(
                "no config given: pass JSON text, '-' (standard input) or a file, "
                f"or set {CONFIG_FILE_ENV} to the file the engine reads"
            )
        return {}  # the engine reads the file KVOFFLOAD_CONFIG names
    if source == "-" or source.lstrip().startswith("{"):
        text = stdin.read() if source == "-" else source
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"the config is not valid JSON: {exc.msg} at line {exc.lineno}, "
                f"column {exc.colno}"
            ) from None
        if not isinstance(value, dict):
            raise ValueError(f"the config is {shown(value)}, not a JSON object")
        return value
    if not Path(source).exists():
        raise ValueError(
            f"{shown(source)} is neither JSON text (it would start with '{{') "
            "nor an existing file"
        )
    in_file = read_config_file(source, "the config file")
    return in_file if is_transfer_config(in_file) else {CONFIG_FILE_KEY: source}


def add_check_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config",
        nargs="?",
        help="kv_connector_extra_config or a whole --kv-transfer-config: JSON "
        "text, '-' for standard input, or a .json/.yaml/.yml file "
        f"(default: the file ${CONFIG_FILE_ENV} names)",
    )
    parser.add_argument(
        "--probe",
        action="store_true",
        help="also ask each Redis tier's server whether it answers (one PING)",
    )


def run_check_config(args: argparse.Namespace) -> int:
    """Prints the resolved configuration (0) or every error (1)."""
    out, err = sys.stdout, sys.stderr
    try:
        config = _read(args.config, sys.stdin)
        errors = _selection_errors(config) if is_transfer_config(config) else []
        transfer = (
            config
            if is_transfer_config(config)
            else {
                "kv_connector": CONNECTOR,
                "kv_connector_module_path": MODULE,
                "kv_connector_extra_config": config,
            }
        )
        try:
            checked = check_transfer_config(transfer)
        except ConfigError as exc:
            errors += exc.messages
        if errors:
            raise ConfigError(errors)
    except (ValueError, TypeError) as exc:
        found = messages_of(exc)
        print(f"kvoffload check-config: {len(found)} error(s)", file=err)
        for message in found:
            print(f"  {message}", file=err)
        return 1
    for where, settings in checked:
        source = f" (from {settings.config_file})" if settings.config_file else ""
        print(f"kvoffload configuration{source}: OK", file=out)
        for line in describe(settings):
            print(f"  {where}{line}", file=out)
        if args.probe:
            _probe(settings, out)
    return 0


def _probe(settings: KVOffloadSettings, out: TextIO) -> None:
    """One PING per Redis tier, each tier's answer on a line."""
    for mapping in settings.secondary_tiers:
        config = parse_tier_config(mapping)
        if isinstance(config, RedisTierConfig):
            reason = probe_redis_tier(config)
            answer = "answers" if reason is None else f"does NOT answer ({reason})"
            print(
                f"  tier {config.name!r}: {redact_url(config.url)} {answer}", file=out
            )
