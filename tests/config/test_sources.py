"""Settings from a JSON or YAML file (`config_file`, `KVOFFLOAD_CONFIG`) and
secrets from the environment (`${NAME}`): what is read, what overrides what, and
errors that name the setting and the variable, never a secret."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from kvoffload.config import ErrorList, messages_of
from kvoffload.config.sources import expand_env, read_config_file
from kvoffload.integrations.vllm.config import KVOffloadSettings

SECRET = "s3cr3t-Pa55"
REDIS_TIER = {"type": "redis", "url": "redis://app:${KV_PW}@cache:6379/0"}


def write(path: Path, data: Any) -> str:
    path.write_text(json.dumps(data))
    return str(path)


def parse(extra: dict[str, Any], **environ: str) -> KVOffloadSettings:
    return KVOffloadSettings.from_extra_config(extra, environ=environ)


def errors_of(extra: dict[str, Any], **environ: str) -> tuple[str, ...]:
    with pytest.raises(ValueError) as caught:
        parse(extra, **environ)
    return messages_of(caught.value)


def test_a_json_file_holds_the_settings_and_inline_keys_override_it(
    tmp_path: Path,
) -> None:
    path = write(tmp_path / "kv.json", {"cpu_bytes_to_use": "1GiB", "max_defer_s": 2})
    settings = parse({"config_file": path, "max_defer_s": 0.5})
    assert settings.cpu_bytes_to_use == 1 << 30
    assert settings.max_defer_s == 0.5, "the inline key wins"
    assert settings.config_file == path


def test_a_yaml_file_holds_the_settings(tmp_path: Path) -> None:
    pytest.importorskip("yaml")
    path = tmp_path / "kv.yaml"
    path.write_text(
        "cpu_bytes_to_use: 2GiB\n"
        "eviction_policy: arc\n"
        "secondary_tiers:\n"
        "  - {type: file, path: /tmp/kv, capacity: 8GiB}\n"
    )
    settings = parse({"config_file": str(path)})
    assert settings.cpu_bytes_to_use == 2 << 30
    assert settings.eviction_policy == "arc"
    assert settings.secondary_tiers[0]["capacity"] == "8GiB"


def test_kvoffload_config_names_the_file_when_the_config_names_none(
    tmp_path: Path,
) -> None:
    path = write(tmp_path / "kv.json", {"cpu_bytes_to_use": "1GiB"})
    settings = parse({}, KVOFFLOAD_CONFIG=path)
    assert settings.cpu_bytes_to_use == 1 << 30
    assert settings.config_file == path
    other = write(tmp_path / "other.json", {"cpu_bytes_to_use": "3GiB"})
    explicit = parse({"config_file": other}, KVOFFLOAD_CONFIG=path)
    assert explicit.cpu_bytes_to_use == 3 << 30, "config_file wins over the variable"


def test_without_pyyaml_a_yaml_file_is_an_error_naming_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "yaml", None)  # `import yaml` raises
    path = tmp_path / "kv.yaml"
    path.write_text("cpu_bytes_to_use: 1GiB\n")
    (message,) = errors_of({"config_file": str(path)})
    assert "kvoffload[yaml]" in message
    assert "['config_file']" in message


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("missing.json", None, r"cannot read '.*missing\.json': No such file"),
        ("kv.toml", "x = 1", r"must be a JSON or YAML file, named by its suffix"),
        ("kv.json", '{"cpu_bytes_to_use": ', r"is not valid JSON: .* line 1, column"),
        ("kv.json", "[1, 2]", r"a value of type list is not a mapping"),
        ("kv.json", '{"config_file": "x.json"}', r"names another config file"),
        ("kv.yaml", f"url: [{SECRET}\n", r"is not valid YAML: .* at line 2"),
    ],
)
def test_a_bad_file_is_one_error_naming_the_setting_and_the_file(
    tmp_path: Path, name: str, text: str | None, expected: str
) -> None:
    if name.endswith(".yaml"):
        pytest.importorskip("yaml")
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    (message,) = errors_of({"config_file": str(path)})
    assert message.startswith("kv_connector_extra_config['config_file']"), message
    assert re.search(expected, message), message
    assert SECRET not in message, "a parse error never quotes the file's text"


def test_env_references_resolve_whole_and_within_strings() -> None:
    errors = ErrorList()
    value = {"a": "${A}", "b": ["x-${A}-${B}"], "c": "$${A} stays", "n": 3}
    expanded = expand_env(value, "where", errors, {"A": "1", "B": "two"})
    assert not errors
    assert expanded == {"a": "1", "b": ["x-1-two"], "c": "${A} stays", "n": 3}


def test_a_secret_from_the_environment_reaches_the_tier_and_no_repr() -> None:
    pytest.importorskip("redis")
    settings = parse(
        {"cpu_bytes_to_use": "1GiB", "secondary_tiers": [REDIS_TIER]}, KV_PW=SECRET
    )
    assert settings.secondary_tiers[0]["url"] == f"redis://app:{SECRET}@cache:6379/0"
    assert SECRET not in repr(settings)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, r"\['url'\]: the environment variable 'KV_PW' \(\$\{KV_PW\}\) is not set"),
        ({"KV_PW": ""}, r"the environment variable 'KV_PW' \(\$\{KV_PW\}\) is empty"),
    ],
)
def test_an_unset_variable_is_an_error_naming_where_and_which(
    environ: dict[str, str], expected: str
) -> None:
    pytest.importorskip("redis")
    (message,) = errors_of(
        {"cpu_bytes_to_use": "1GiB", "secondary_tiers": [REDIS_TIER]}, **environ
    )
    assert message.startswith("kv_connector_extra_config['secondary_tiers'][0]")
    assert re.search(expected, message), message


def test_an_unresolved_tier_does_not_hide_the_errors_of_the_others() -> None:
    """Scenario: a Redis tier's password variable is unset (checked on a
    laptop, say) and the file tier after it has a typo: both are reported, and
    nothing about the Redis tier's URL that only the missing value caused."""
    pytest.importorskip("redis")
    errors = errors_of(
        {
            "cpu_bytes_to_use": "${KV_HOST_BYTES}",
            "secondary_tiers": [
                REDIS_TIER,
                {"type": "file", "path": "/tmp/kv", "capacity": "1GiB", "fsyn": True},
            ],
        },
        KV_HOST_BYTES="nonsense",
    )
    assert len(errors) == 3, errors
    assert any(
        e.startswith("kv_connector_extra_config['cpu_bytes_to_use']: ") for e in errors
    )
    assert any("'KV_PW'" in e for e in errors)
    assert any("unknown key 'fsyn' (did you mean 'fsync'?)" in e for e in errors)


def test_a_malformed_reference_is_an_error() -> None:
    errors = ErrorList()
    expand_env("${1BAD}", "where", errors, {})
    assert errors.messages == [
        "where: ${1BAD} does not name an environment variable (letters, digits "
        "and '_', not starting with a digit)"
    ]


def test_read_config_file_checks_the_shape_of_what_it_reads(tmp_path: Path) -> None:
    path = write(tmp_path / "kv.json", {"a": {"b": [1, 2]}})
    assert read_config_file(path, "here") == {"a": {"b": [1, 2]}}
    with pytest.raises(ValueError, match="here: 3 is not the path of a config file"):
        read_config_file(3, "here")
