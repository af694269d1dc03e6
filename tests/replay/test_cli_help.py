"""`kvoffload --help` and its planner commands': every option has help, and every
option that takes a value says its default (`--help` showed no defaults, and
`--offload-prompt-only` had no help at all)."""

from __future__ import annotations

import argparse
import re

import pytest

from kvoffload.cli import main as kvoffload_main
from kvoffload.replay.cli import add_replay_arguments

COMMANDS = [[], ["replay"], ["demo"], ["check-config"]]


def help_text(
    command: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> str:
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as stopped:
        kvoffload_main([*command, "--help"])
    assert stopped.value.code == 0
    return capsys.readouterr().out


def options(text: str) -> dict[str, tuple[str, str]]:
    """Each option of the help's `options:` section: its invocation (`--flag
    METAVAR`) and its help, continuation lines joined."""
    section = text.split("\noptions:\n", 1)[1]
    entries: dict[str, tuple[str, str]] = {}
    name = ""
    for line in section.splitlines():
        if re.match(r"  -", line):
            invocation, _, help_ = line.strip().partition("  ")
            name = re.findall(r"--?[\w-]+", invocation)[-1]
            entries[name] = (invocation, help_.strip())
        elif line.startswith("      ") and name:
            invocation, help_ = entries[name]
            entries[name] = (invocation, f"{help_} {line.strip()}".strip())
        elif line.strip():
            name = ""  # another section
    return entries


def shown(default: object) -> str:
    if isinstance(default, list):
        return " ".join(map(str, default))
    return str(default)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "top")
def test_every_option_has_help_and_every_value_option_its_default(
    command: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entries = options(help_text(command, capsys, monkeypatch))
    assert "--help" in entries
    for name, (invocation, help_) in entries.items():
        assert help_, f"{name} has no help"
        takes_value = invocation.split(",")[-1].strip() != name
        if takes_value:
            assert "default" in help_, f"{name}: {help_!r} shows no default"


def test_defaults_in_the_replay_help_are_the_parser_defaults(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = options(help_text(["replay"], capsys, monkeypatch))
    parser = argparse.ArgumentParser()
    add_replay_arguments(parser)
    checked = 0
    for name, (_, help_) in entries.items():
        default = parser.get_default(name.lstrip("-").replace("-", "_"))
        if not any(default is v for v in (None, False, argparse.SUPPRESS)):
            assert f"default: {shown(default)}" in help_, (name, help_)
            checked += 1
    assert checked >= 5  # --device-tokens, --store-threshold, --time-scale, ...


def test_the_capacity_help_says_how_bytes_become_chunks(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = options(help_text(["replay"], capsys, monkeypatch))
    _, capacity = entries["--capacity"]
    assert "SIZE // (chunk tokens x KV bytes per token)" in capacity
    assert "--kv-bytes-per-token or --model" in capacity
    _, model = entries["--model"]
    assert "llama-3.1-8b" in model
    _, kv_bytes = entries["--kv-bytes-per-token"]
    assert "default: 131,072" in kv_bytes


def test_the_demo_help_shows_where_the_report_goes(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = options(help_text(["demo"], capsys, monkeypatch))
    assert "(default: reports)" in entries["--report-dir"][1]
