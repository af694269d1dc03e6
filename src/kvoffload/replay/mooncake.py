"""Reading Mooncake-format traces (JSON lines of timestamp, lengths and hash ids).

Each hash id names one 512-token block of the prompt; equal ids at equal positions
mean a shared prefix, so ids are used directly as chained block hashes. The last id
may cover a partial block. With `partial="pad"` (the default) the prompt is padded
to whole blocks plus one new token, so every id is a chunk that can hit (what the
reference figures count; the token hit ratio still counts true prompt tokens);
with `partial="drop"` the true length is kept and a partial last block is never
stored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from kvoffload.replay.workload import Workload, WorkloadRequest

MOONCAKE_BLOCK_TOKENS = 512


def _id_hash(hash_id: int) -> bytes:
    return b"mc" + hash_id.to_bytes(8, "big", signed=True)


def _output_hashes(index: int, n: int) -> list[bytes]:
    # Outputs are never reused by the trace: give them unique hashes.
    return [b"out" + index.to_bytes(6, "big") + i.to_bytes(4, "big") for i in range(n)]


def load_mooncake(
    path: str | Path,
    partial: Literal["pad", "drop"] = "pad",
    limit: int | None = None,
    time_scale: float = 1.0,
) -> Workload:
    """Read a Mooncake JSONL trace; raises ValueError naming the bad line."""
    if partial not in ("pad", "drop"):
        raise ValueError(f"partial must be 'pad' or 'drop', got {partial!r}")
    block = MOONCAKE_BLOCK_TOKENS
    requests: list[WorkloadRequest] = []
    actual: list[int] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            if limit is not None and len(requests) >= limit:
                break
            try:
                rec = json.loads(line)
                ids = [int(h) for h in rec["hash_ids"]]
                input_len = int(rec["input_length"])
                output_len = max(1, int(rec["output_length"]))
                arrival = float(rec["timestamp"]) / 1000.0 * time_scale
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(
                    f"{path}:{lineno}: not a Mooncake record: {exc}"
                ) from exc
            prompt = len(ids) * block + 1 if partial == "pad" else input_len
            hashes = [_id_hash(h) for h in ids[: prompt // block]]
            out_blocks = (prompt + output_len) // block - len(hashes)
            hashes += _output_hashes(len(requests), max(0, out_blocks))
            requests.append(
                WorkloadRequest(arrival, prompt, output_len, hashes, "trace")
            )
            actual.append(input_len)
    requests_sorted = sorted(range(len(requests)), key=lambda i: requests[i].arrival)
    return Workload(
        name=Path(path).name,
        requests=tuple(requests[i] for i in requests_sorted),
        hash_block_tokens=block,
        actual_prompt_tokens=tuple(actual[i] for i in requests_sorted),
    )
