"""One vLLM engine with tensor parallelism on the CPU platform, run as a script.

vLLM's CPU platform runs each tensor-parallel rank in a worker process of its own,
its threads bound to a CPU (`VLLM_CPU_OMP_THREADS_BIND`), which an in-process
test engine cannot do; `test_tensor_parallel_e2e.py` runs this file in a
subprocess. It plays the scenario of `test_connector_e2e.py` (request A, fillers
that evict A from the device cache, A again) and prints one JSON line with each
run of A's cached tokens and greedy output.

    python tp_engine.py TP FILE_DIR|- EVICT(0|1)
"""

from __future__ import annotations

import json
import sys
from typing import Any

from kvoffload.integrations.vllm.model_builder import TINY, build_model, synthetic_text

PAGE = 4 * 131072  # one block of all four layers of the tiny model, float32
A = synthetic_text(250, seed=1)  # 347 tokens: two whole chunks and a tail
FILLERS = [synthetic_text(240, seed=10 + i) for i in range(8)]


def kv_config(directory: str) -> dict[str, Any]:
    # The engine's total, as in vLLM: 64 chunk slots at any TP (a rank's slice
    # of a chunk is PAGE / TP), more than the 18 chunks of A and the fillers.
    extra: dict[str, Any] = {"cpu_bytes_to_use": "32MiB"}
    if directory != "-":
        extra["secondary_tiers"] = [
            {"type": "file", "path": directory, "capacity": "64MiB"}
        ]
    return {
        "kv_connector": "KVOffloadConnector",
        "kv_connector_module_path": "kvoffload.integrations.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra,
    }


def main(tp: int, directory: str, evict: bool) -> None:
    from vllm import LLM, SamplingParams

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
    report = [
        {"cached": out.num_cached_tokens, "tokens": list(out.outputs[0].token_ids)}
        for out in runs
    ]
    llm.llm_engine.engine_core.shutdown()  # flushes stores to the file tier
    print("RESULT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1")
