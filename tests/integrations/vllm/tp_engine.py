"""vLLM engines with tensor parallelism on the CPU platform, run as a script.

vLLM's CPU platform runs each tensor-parallel rank in a worker process of its own,
its threads bound to a CPU (`VLLM_CPU_OMP_THREADS_BIND`), which an in-process
test engine cannot do; `test_tensor_parallel_e2e.py` runs this file in a
subprocess. It starts three engines on one file-tier directory, one after
another:

- `first`: two ranks play the scenario of `test_connector_e2e.py` (request A,
  fillers that evict A from the device cache, A again);
- `restarted`: two ranks, A once, on what `first` left on disk;
- `single`: one rank, A once, on the same directory.

A two-rank engine's core and ranks are processes of their own (started fresh,
with this process's environment), so `restarted` starts as fresh as it would in
a script run of its own; `single`, the last, runs its core in this process. Each
process start imports vLLM (seconds of CPU), so one script run for the three
spares three of them.

It prints one JSON line: each engine's runs of A (cached tokens and greedy
output) and the chunk files on disk when `first` has shut down.

    python tp_engine.py FILE_DIR
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from kvoffload.integrations.vllm.model_builder import TINY, build_model, synthetic_text

PAGE = 4 * 131072  # one block of all four layers of the tiny model, float32
A = synthetic_text(250, seed=1)  # 347 tokens: two whole chunks and a tail
FILLERS = [synthetic_text(240, seed=10 + i) for i in range(8)]


def kv_config(directory: str) -> dict[str, Any]:
    # The engine's total, as in vLLM: 64 chunk slots at any TP (a rank's slice
    # of a chunk is PAGE / TP), more than the 18 chunks of A and the fillers.
    return {
        "kv_connector": "KVOffloadConnector",
        "kv_connector_module_path": "kvoffload.integrations.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "cpu_bytes_to_use": "32MiB",
            "secondary_tiers": [
                {"type": "file", "path": directory, "capacity": "64MiB"}
            ],
        },
    }


def play(tp: int, directory: str, evict: bool) -> list[dict[str, Any]]:
    """Starts an engine of `tp` ranks, runs A (and, if `evict`, the fillers
    and A again), shuts it down; each run of A's cached tokens and output."""
    from vllm import LLM, SamplingParams

    # Both are read when the engine starts (vLLM caches its settings only in
    # an engine core's process, which for two ranks is not this one).
    cpus = sorted(os.sched_getaffinity(0))[:tp]
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(map(str, cpus))
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if tp > 1 else "0"
    model = build_model(TINY)
    args: dict[str, Any] = dict(
        model.vllm_args(),
        enforce_eager=True,
        max_model_len=2048,
        seed=0,
        tensor_parallel_size=tp,
        # The same 16 usable blocks as the single-rank tests: each rank holds
        # its share of every block.
        kv_cache_memory_bytes=17 * PAGE // tp,
        max_num_batched_tokens=2048,
        kv_transfer_config=kv_config(directory),
    )
    llm = LLM(**args)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)

    def run(prompt: str) -> Any:
        return llm.generate([prompt], params, use_tqdm=False)[0]

    runs = [run(A)]
    if evict:
        for prompt in FILLERS:
            run(prompt)
        runs.append(run(A))
    llm.llm_engine.engine_core.shutdown()  # flushes stores to the file tier
    return [
        {"cached": out.num_cached_tokens, "tokens": list(out.outputs[0].token_ids)}
        for out in runs
    ]


def main(directory: str) -> None:
    report: dict[str, Any] = {"first": play(2, directory, evict=True)}
    report["chunk_files_after_first"] = len(list(Path(directory).rglob("*.kvc")))
    report["restarted"] = play(2, directory, evict=False)
    report["single"] = play(1, directory, evict=False)
    print("RESULT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
