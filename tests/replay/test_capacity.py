"""Host tier capacities in bytes (`--capacity 16GiB`), as users size memory: the
planner took only chunks or tokens. Bytes become whole chunks at the per-token
KV size of `--kv-bytes-per-token`, of a named model (`--model`), or the time
model's default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvoffload.cli import main as kvoffload_main
from kvoffload.engine_model import TimeModel
from kvoffload.replay.capacity import MODEL_SHAPES, ModelShape

GiB = 1 << 30
CHUNK = 512  # tokens: a Mooncake trace's block
LINE = (
    '{"timestamp": 0, "input_length": 1500, "output_length": 10, "hash_ids": [0, 1, 2]}'
)


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text(LINE + "\n")
    return path


def capacities(
    trace: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> list[int]:
    assert kvoffload_main(["replay", str(trace), *argv, "--json", "--jobs", "1"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    return [r["capacity_chunks"] for r in records if r["policy"] == "lru"]


@pytest.mark.parametrize(
    ("argv", "chunks"),
    [
        # 512 tokens x 128 KiB (the default: an 8B model in bf16) = 64 MiB a chunk
        (["--capacity", "16GiB"], [256]),
        (["--capacity", "16GB", "1TiB", "16GiB"], [10**9 * 16 // (64 << 20), 256, 16384]),
        (["--capacity", "16GiB", "--kv-bytes-per-token", "65536"], [512]),
        # 80 layers x 8 KV heads x 128 x 2 x 2 bytes = 320 KiB a token
        (["--capacity", "16GiB", "--model", "llama-3.1-70b"], [16 * GiB // (CHUNK * 327_680)]),
        (["--capacity", "16GiB", "--model", "Qwen2.5-7B"], [16 * GiB // (CHUNK * 57_344)]),
        (["--capacity", "100GiB", "--engines", "2"], [1600]),  # a fleet's, per engine
    ],
)  # fmt: skip
def test_a_capacity_in_bytes_holds_as_many_whole_chunks_as_fit(
    argv: list[str],
    chunks: list[int],
    trace: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert capacities(trace, argv, capsys) == chunks


def test_the_default_kv_size_is_the_named_8b_models() -> None:
    assert MODEL_SHAPES["llama-3.1-8b"].kv_bytes_per_token == 131_072
    assert TimeModel().kv_bytes_per_token == 131_072
    assert ModelShape(80, 8, 128).kv_bytes_per_token == 320 * 1024


def test_model_sizes_the_time_model_too(
    trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A larger KV cache per token takes longer to load: --model is the
    --kv-bytes-per-token of its shape."""
    two = (LINE + "\n" + LINE.replace('"timestamp": 0', '"timestamp": 9000')) + "\n"
    trace.write_text(two)

    def ttft(extra: list[str]) -> float:
        argv = ["replay", str(trace), "--capacity-chunks", "8", "--json", *extra]
        assert kvoffload_main([*argv, "--jobs", "1"]) == 0
        record = json.loads(capsys.readouterr().out.splitlines()[0])
        return float(record["est_ttft_s"])

    by_model = ttft(["--model", "llama-3.1-405b"])
    by_bytes = ttft(["--kv-bytes-per-token", str(2 * 126 * 8 * 128 * 2)])
    assert by_model == by_bytes > ttft(["--model", "llama-3.2-1b"])


def usage_error(
    trace: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> str:
    with pytest.raises(SystemExit) as stopped:
        kvoffload_main(["replay", str(trace), *argv, "--jobs", "1"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = [x for x in err.splitlines() if "error:" in x]
    return line


@pytest.mark.usefixtures("no_replay")
@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--capacity", "16"], "argument --capacity: '16' has no unit; expected a size"),
        (["--capacity", "16GB/s"], "argument --capacity: '16GB/s' is not a size with a unit"),
        (["--capacity", "0GiB"], "'0GiB' is not a size with a unit such as 16GiB"),
        (["--capacity", "1.5B"], "'1.5B' is not a size"),
        (["--capacity=-1GiB"], "'-1GiB' is not a size"),
        (["--capacity", "2000TiB"], "from 1 B to 1024 TiB"),
        (["--capacity", "nan"], "'nan' is not a size"),
        (["--capacity", "9" * 5000 + "GiB"], "is not a size"),
        (["--capacity"], "argument --capacity: expected at least one argument"),
        (["--capacity=--"], "argument --capacity: expected at least one value"),
        (
            ["--capacity", "16GiB", "--capacity-chunks", "5"],
            "argument --capacity-chunks: not allowed with argument --capacity",
        ),
        (
            ["--capacity-tokens", "5000", "--capacity", "1GiB"],
            "argument --capacity: not allowed with argument --capacity-tokens",
        ),
        (["--model", "llama3.1-8b"], "not a known model shape; did you mean 'llama-3.1-8b'?"),
        (["--model", "gpt"], "'gpt' is not a known model shape; expected one of llama"),
        (
            ["--model", "qwen3-8b", "--kv-bytes-per-token", "1000"],
            "give --model or --kv-bytes-per-token, not both",
        ),
        (
            ["--capacity", "16MiB"],
            "--capacity 16MiB: a chunk is 512 tokens of 131,072 bytes, 64 MiB; "
            "give at least that much",
        ),
        (
            ["--capacity", "1000TiB", "--kv-bytes-per-token", "1", "--chunk-tokens", "512"],
            "are more than 1,099,511,627,776 chunks",
        ),
    ],
)  # fmt: skip
def test_a_bad_capacity_or_model_is_one_line_naming_it(
    argv: list[str], says: str, trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert says in usage_error(trace, argv, capsys)
