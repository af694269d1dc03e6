"""`kvoffload check-config`: the configuration checked offline, as the connector
checks it, printed resolved (secrets masked) or with every error (exit 1)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from kvoffload.cli import main

SECRET = "s3cr3t-Pa55"
GOOD = {
    "cpu_bytes_to_use": "64GiB",
    "secondary_tiers": [{"type": "file", "path": "/nvme/kv", "capacity": "1TiB"}],
}


def transfer(extra: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {
        "kv_connector": "KVOffloadConnector",
        "kv_connector_module_path": "kvoffload.integrations.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra,
        **fields,
    }


def check(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["check-config", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_good_config_prints_one_line_per_tier(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = check(capsys, json.dumps(GOOD))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "kvoffload configuration: OK"
    assert lines[1].startswith("  host memory 'cpu': 64 GiB, eviction lru")
    assert lines[2].startswith(
        "  tier 'file' (file, local): /nvme/kv, capacity 1 TiB, eviction lru"
    )
    assert len(lines) == 3


def test_every_error_is_printed_with_suggestions_and_the_exit_code_is_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bad = {
        "cpu_bytes_to_use": "64GiB",
        "evicton_policy": "arc",
        "secondary_tiers": [{"type": "file", "path": "/nvme/kv", "capcity": "1TiB"}],
    }
    code, out, err = check(capsys, json.dumps(bad))
    assert code == 1
    assert out == ""
    assert err.startswith("kvoffload check-config: 3 error(s)\n")
    assert "unknown key 'evicton_policy' (did you mean 'eviction_policy'?)" in err
    assert "unknown key 'capcity' (did you mean 'capacity'?)" in err
    assert "missing required key(s) ['capacity']" in err


def test_max_hinted_share_is_shown_resolved(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = check(capsys, json.dumps(GOOD))
    assert code == 0, err
    assert "max_hinted_share 0.35" in out.splitlines()[1]  # the default
    code, out, err = check(capsys, json.dumps({**GOOD, "max_hinted_share": 0.5}))
    assert code == 0, err
    assert "max_hinted_share 0.5" in out.splitlines()[1]


@pytest.mark.parametrize("bad", [2, "x", -0.1, True, None, float("nan"), [0.5]])
def test_a_bad_max_hinted_share_is_an_error_naming_the_key(
    capsys: pytest.CaptureFixture[str], bad: object
) -> None:
    code, out, err = check(capsys, json.dumps({**GOOD, "max_hinted_share": bad}))
    assert code == 1 and out == ""
    assert "max_hinted_share" in err and "is not a number in [0, 1]" in err


def test_a_whole_kv_transfer_config_is_checked_too(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = check(capsys, json.dumps(transfer(GOOD)))
    assert code == 0
    assert "host memory 'cpu': 64 GiB" in out
    wrong = transfer({"cpu_bytes_to_use": 1}, kv_role=None)
    code, _, err = check(capsys, json.dumps(wrong))
    assert code == 1
    assert "kv_role: not set" in err
    other = transfer(GOOD, kv_connector="LMCacheConnectorV1")
    code, _, err = check(capsys, json.dumps(other))
    assert code == 1
    assert "does not select kvoffload" in err


def test_kvoffload_inside_vllms_multi_connector_is_found(
    capsys: pytest.CaptureFixture[str],
) -> None:
    child = transfer({"cpu_bytes_to_use": "1GiB", "blok_size": 256})
    multi = {
        "kv_connector": "MultiConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "connectors": [{"kv_connector": "NixlConnector"}, child]
        },
    }
    code, _, err = check(capsys, json.dumps(multi))
    assert code == 1
    assert "connectors[1]: kv_connector_extra_config: unknown key 'blok_size'" in err


def test_files_and_standard_input(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = tmp_path / "kv.json"
    settings.write_text(json.dumps(GOOD))
    code, out, _ = check(capsys, str(settings))
    assert code == 0
    assert out.startswith(f"kvoffload configuration (from {settings}): OK")
    whole = tmp_path / "transfer.json"
    whole.write_text(json.dumps(transfer(GOOD)))
    assert check(capsys, str(whole))[0] == 0
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(GOOD)))
    assert check(capsys, "-")[0] == 0
    code, _, err = check(capsys, str(tmp_path / "absent.json"))
    assert code == 1
    assert "neither JSON text" in err


def test_without_an_argument_kvoffload_config_is_checked(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KVOFFLOAD_CONFIG", raising=False)
    code, _, err = check(capsys)
    assert code == 1
    assert "KVOFFLOAD_CONFIG" in err
    settings = tmp_path / "kv.json"
    settings.write_text(json.dumps(GOOD))
    monkeypatch.setenv("KVOFFLOAD_CONFIG", str(settings))
    code, out, _ = check(capsys)
    assert code == 0
    assert f"(from {settings})" in out


def test_secrets_are_masked_and_env_references_resolved(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("redis")
    monkeypatch.setenv("KV_PW", SECRET)
    extra = {
        "cpu_bytes_to_use": "1GiB",
        "secondary_tiers": [
            {"type": "redis", "url": "redis://app:${KV_PW}@cache:6380/0", "ttl_s": 60}
        ],
    }
    code, out, _ = check(capsys, json.dumps(extra))
    assert code == 0
    assert "tier 'redis' (redis, remote): redis://app:***@cache:6380/0" in out
    assert "ttl 60 s" in out
    assert SECRET not in out
    monkeypatch.delenv("KV_PW")
    code, _, err = check(capsys, json.dumps(extra))
    assert code == 1
    assert "the environment variable 'KV_PW' (${KV_PW}) is not set" in err


def test_probe_says_which_redis_tier_does_not_answer(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A dead loopback port: refused at once, named without the password; the
    configuration itself is valid (exit 0), as the engine would start."""
    pytest.importorskip("redis")
    from kvoffload.tiers.secondary.redis_server import free_port

    url = f"redis://app:{SECRET}@127.0.0.1:{free_port()}/0"
    extra = {
        "cpu_bytes_to_use": "1GiB",
        "secondary_tiers": [{"type": "redis", "url": url}],
    }
    code, out, _ = check(capsys, json.dumps(extra), "--probe")
    assert code == 0
    probed = out.splitlines()[-1]
    assert probed.startswith("  tier 'redis': redis://app:***@127.0.0.1:")
    assert "does NOT answer" in probed
    assert SECRET not in out
