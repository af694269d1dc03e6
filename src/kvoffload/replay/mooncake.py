"""Reading Mooncake-format traces (JSON lines of timestamp, lengths and hash ids).

Each hash id names one 512-token block of the prompt; equal ids at equal positions
mean a shared prefix, so ids are used directly as chained block hashes. The last id
may cover a partial block. With `partial="pad"` (the default) the prompt is padded
to whole blocks plus one new token, so every id is a chunk that can hit (what the
reference figures count; the token hit ratio still counts true prompt tokens);
with `partial="drop"` the true length is kept and a partial last block is never
stored. An `output_length` of 0 generates one token, as an engine does.

Every line is checked (`trace_record`, bounds in `limits`): a trace that cannot be
replayed raises `TraceError`, one line naming the file, the line and the field.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from kvoffload.replay.limits import MAX_ARRIVAL_S, MAX_LINE_BYTES
from kvoffload.replay.trace_record import RecordError, TraceRecord, parse_record
from kvoffload.replay.workload import Workload, WorkloadRequest

MOONCAKE_BLOCK_TOKENS = 512
_BOM = b"\xef\xbb\xbf"


class TraceError(ValueError):
    """A trace that cannot be replayed: `path`, `line` (None for the file as a
    whole), `field` (None for the line as a whole), in a one-line message."""

    def __init__(
        self, path: str | Path, line: int | None, problem: str, field: str | None = None
    ) -> None:
        where = str(path) if line is None else f"{path}:{line}"
        super().__init__(" ".join(f"{where}: {problem}".splitlines()))
        self.path = str(path)
        self.line = line
        self.field = field


def _id_hash(hash_id: int) -> bytes:
    # Unsigned: the same bytes as the signed form for every id below 2^63.
    return b"mc" + hash_id.to_bytes(8, "big")


def _output_hashes(index: int, n: int) -> list[bytes]:
    # Outputs are never reused by the trace: give them unique hashes.
    return [b"out" + index.to_bytes(6, "big") + i.to_bytes(4, "big") for i in range(n)]


def read_records(
    path: str | Path, limit: int | None = None
) -> Iterator[tuple[int, TraceRecord]]:
    """(line number, record) for each non-blank line of the trace, up to `limit`
    records; `TraceError` for the first line or read that fails."""
    count = 0
    try:
        with open(path, "rb") as f:
            for lineno in itertools.count(1):
                if limit is not None and count >= limit:
                    return
                raw = f.readline(MAX_LINE_BYTES + 1)
                if not raw:
                    break
                if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                    raise TraceError(
                        path, lineno, f"longer than {MAX_LINE_BYTES:,} bytes"
                    )
                if lineno == 1:
                    raw = raw.removeprefix(_BOM)
                if not raw.strip():
                    continue
                try:
                    record = parse_record(raw.strip(), MOONCAKE_BLOCK_TOKENS)
                except RecordError as exc:
                    raise TraceError(path, lineno, str(exc), exc.field) from None
                count += 1
                yield lineno, record
    except OSError as exc:
        raise TraceError(
            path, None, f"cannot read the trace: {exc.strerror or exc}"
        ) from None
    if count == 0:
        raise TraceError(path, None, "no requests: the trace is empty")


def load_mooncake(
    path: str | Path,
    partial: Literal["pad", "drop"] = "pad",
    limit: int | None = None,
    time_scale: float = 1.0,
) -> Workload:
    """Read a Mooncake JSONL trace; raises `TraceError` naming the bad line."""
    if partial not in ("pad", "drop"):
        raise ValueError(f"partial must be 'pad' or 'drop', got {partial!r}")
    if not (math.isfinite(time_scale) and time_scale > 0):
        raise ValueError(f"time_scale must be a finite number > 0, got {time_scale!r}")
    block = MOONCAKE_BLOCK_TOKENS
    requests: list[WorkloadRequest] = []
    actual: list[int] = []
    for lineno, record in read_records(path, limit):
        arrival = record.timestamp_ms / 1000.0 * time_scale
        if arrival > MAX_ARRIVAL_S:
            raise TraceError(
                path,
                lineno,
                f"timestamp: {record.timestamp_ms:g} ms stretched x{time_scale:g} "
                f"arrives past the replay's limit of {MAX_ARRIVAL_S:g} s",
                "timestamp",
            )
        ids = record.hash_ids
        prompt = len(ids) * block + 1 if partial == "pad" else record.input_length
        output_len = max(1, record.output_length)
        hashes = [_id_hash(h) for h in ids[: prompt // block]]
        out_blocks = (prompt + output_len) // block - len(hashes)
        hashes += _output_hashes(len(requests), max(0, out_blocks))
        requests.append(WorkloadRequest(arrival, prompt, output_len, hashes, "trace"))
        actual.append(record.input_length)
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival)
    return Workload(
        name=Path(path).name,
        requests=tuple(requests[i] for i in order),
        hash_block_tokens=block,
        actual_prompt_tokens=tuple(actual[i] for i in order),
    )
