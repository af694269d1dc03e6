"""Where a configuration comes from: a JSON or YAML file, and the environment.

`kv_connector_extra_config` may name a file (`"config_file": "/etc/kvoffload.yaml"`,
or the `KVOFFLOAD_CONFIG` environment variable when it names none) that holds the
same mapping; keys written beside `config_file` override the file's. Any string
value, in the file or inline, may hold `${NAME}`: the value of the environment
variable NAME (`$${` writes a literal `${`). So passwords stay out of the command
line and out of the `kv_transfer_config` that vLLM logs at start-up. An unset or
empty variable is an error naming where it is used and the variable, never a value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvoffload.config.errors import ErrorList
from kvoffload.config.shapes import config_mapping, shown

CONFIG_FILE_KEY = "config_file"
CONFIG_FILE_ENV = "KVOFFLOAD_CONFIG"
SUFFIXES = (".json", ".yaml", ".yml")
YAML_MISSING = (
    "reading a YAML file needs PyYAML, which is not installed here: "
    "pip install 'kvoffload[yaml]' (or pip install pyyaml), or write the file as JSON"
)

# `${NAME}`, or `$${...}` for a literal `${...}`.
_REFERENCE = re.compile(r"\$(\$?)\{([^}]*)\}")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def read_config_file(path: object, where: str) -> dict[str, Any]:
    """The mapping in the JSON or YAML file at `path`, read by its suffix.

    Errors name `where` (the setting that named the file) and the file; a parse
    error gives the line and column, never the text there (it may be a password).
    """
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"{where}: {shown(path)} is not the path of a config file")
    suffix = Path(path).suffix.lower()
    if suffix not in SUFFIXES:
        raise ValueError(
            f"{where}: {shown(path)} must be a JSON or YAML file, named by its "
            f"suffix: one of {SUFFIXES}"
        )
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ValueError(f"{where}: cannot read {shown(path)}: {reason}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{where}: {shown(path)} is not UTF-8 text") from None
    data = (
        _parse_json(text, path, where)
        if suffix == ".json"
        else _parse_yaml(text, path, where)
    )
    return config_mapping(data, f"{where} ({path})")


def _parse_json(text: str, path: str, where: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{where}: {shown(path)} is not valid JSON: {exc.msg} at line "
            f"{exc.lineno}, column {exc.colno}"
        ) from None
    except ValueError as exc:  # an int of more digits than Python converts
        raise ValueError(f"{where}: {shown(path)}: {exc}") from None


def _parse_yaml(text: str, path: str, where: str) -> object:
    try:
        import yaml
    except ImportError:
        raise ValueError(f"{where}: {shown(path)}: {YAML_MISSING}") from None
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        # Not str(exc): it quotes the line, which may hold a password.
        mark = exc.problem_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ValueError(
            f"{where}: {shown(path)} is not valid YAML: {exc.problem}{at}"
        ) from None
    except (yaml.YAMLError, ValueError) as exc:
        raise ValueError(
            f"{where}: {shown(path)} is not valid YAML ({type(exc).__name__})"
        ) from None


def with_config_file(
    config: Mapping[str, Any], where: str, environ: Mapping[str, str]
) -> tuple[dict[str, Any], str | None]:
    """`config` over the file it names (`config_file`, else `$KVOFFLOAD_CONFIG`),
    and the path of that file, if any. The path may itself use `${NAME}`."""
    inline = dict(config)
    if CONFIG_FILE_KEY in inline:
        named = inline.pop(CONFIG_FILE_KEY)
        key = f"{where}[{CONFIG_FILE_KEY!r}]"
        errors = ErrorList()
        path = expand_env(named, key, errors, environ)
        errors.raise_if_any()
    elif environ.get(CONFIG_FILE_ENV):
        path = environ[CONFIG_FILE_ENV]
        key = f"the environment variable {CONFIG_FILE_ENV}"
    else:
        return inline, None
    in_file = read_config_file(path, key)
    if CONFIG_FILE_KEY in in_file:
        raise ValueError(
            f"{key}: {shown(path)} names another config file ({CONFIG_FILE_KEY!r}); "
            "a config file holds the settings themselves"
        )
    return {**in_file, **inline}, path


def expand_env(
    value: Any, where: str, errors: ErrorList, environ: Mapping[str, str]
) -> Any:
    """`value` with `${NAME}` in every string replaced by the variable's value
    (in mappings and lists too, whose keys stay as they are). An unset or empty
    variable, or a malformed name, is recorded in `errors` under `where` and the
    keys down to the string; the string is then left as it was."""
    if isinstance(value, str):
        return _expand_string(value, where, errors, environ)
    if isinstance(value, Mapping):
        return {
            key: expand_env(child, f"{where}[{shown(key)}]", errors, environ)
            for key, child in value.items()
        }
    if isinstance(value, list | tuple):
        return [
            expand_env(child, f"{where}[{i}]", errors, environ)
            for i, child in enumerate(value)
        ]
    return value


def _expand_string(
    text: str, where: str, errors: ErrorList, environ: Mapping[str, str]
) -> str:
    if "${" not in text:
        return text
    failed: list[str] = []

    def replace(match: re.Match[str]) -> str:
        escaped, name = match.group(1), match.group(2)
        if escaped:
            return match.group(0)[1:]
        if not _NAME.fullmatch(name):
            failed.append(
                f"{where}: ${{{shown(name)[1:-1]}}} does not name an environment "
                "variable (letters, digits and '_', not starting with a digit)"
            )
            return match.group(0)
        found = environ.get(name)
        if not found:
            state = "is empty" if found == "" else "is not set"
            failed.append(
                f"{where}: the environment variable {name!r} (${{{name}}}) {state}"
            )
            return match.group(0)
        return found

    expanded = _REFERENCE.sub(replace, text)
    if failed:
        for message in failed:
            errors.add(message)
        return text
    return expanded
