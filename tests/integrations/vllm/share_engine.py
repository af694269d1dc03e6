"""One vLLM engine (CPU platform) in a process of its own, driven over stdin, for
`test_live_sharing.py`: engines that run at the same time and share tiers.

    python share_engine.py CONFIG_JSON

CONFIG_JSON: `{"model": {...vllm_args...}, "kv": {...extra config...} | null}`.
The engine core runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so
that a SIGKILL of it kills the whole engine. It prints `READY` once started,
then reads one JSON command per line and answers each with one line
`REPLY <json>` (`ERROR <text>` for a failed command); other lines (vLLM's
logs) are not ours. Commands:

- `{"op": "generate", "prompts": [...], "params": {...} | null}`: greedy, 8
  tokens, `params` as every request's `kv_transfer_params`; replies each
  prompt's `cached` tokens and `tokens`.
- `{"op": "metrics"}`: kvoffload's metrics, `{"<metric>|<tier>": value}`.
- `{"op": "step_until", "metric": "<metric>|<tier>", "at_least": N}`: runs
  one-token requests (steps that store nothing) until the metric reaches N,
  for at most `timeout_s`; replies the metrics.
- `{"op": "block_file_writes_after", "n": N}`: from now, the file tier's
  (N+1)-th chunk write writes its header only and then blocks for good,
  printing `EVENT blocked` (for a SIGKILL in the middle of a store).
- `{"op": "exit"}`: shuts the engine down and exits.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from typing import Any

PAGE = 4 * 131072  # one block of all four layers of the tiny model, float32
DEVICE = {"kv_cache_memory_bytes": 17 * PAGE, "max_num_batched_tokens": 2048}
_out = threading.Lock()


def say(line: str) -> None:
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def block_file_writes_after(n: int) -> None:
    """Patch the file tier's writes: the (n+1)-th from now writes its first
    buffer (the header page), says so, and never returns."""
    from kvoffload.tiers.secondary import file_io

    real = file_io._write_all
    count = [0]

    def write_all(fd: int, buffers: list[memoryview]) -> None:
        count[0] += 1
        if count[0] <= n:
            real(fd, buffers)
            return
        real(fd, buffers[:1])
        say("EVENT blocked")
        threading.Event().wait()

    file_io._write_all = write_all


def metrics(llm: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:kvoffload_") and hasattr(metric, "value"):
            name = metric.name.removeprefix("vllm:kvoffload_")
            tier = metric.labels.get("tier", "")
            key = f"{name}|{tier}"
            out[key] = out.get(key, 0.0) + float(metric.value)
    return out


def main(config: dict[str, Any]) -> None:
    from vllm import LLM, SamplingParams

    args: dict[str, Any] = dict(
        config["model"],
        enforce_eager=True,
        max_model_len=2048,
        seed=0,
        disable_log_stats=False,
        **DEVICE,
    )
    if config.get("kv") is not None:
        args["kv_transfer_config"] = {
            "kv_connector": "KVOffloadConnector",
            "kv_connector_module_path": "kvoffload.integrations.vllm",
            "kv_role": "kv_both",
            "kv_connector_extra_config": config["kv"],
        }
    llm = LLM(**args)

    def generate(prompts: list[str], params: dict[str, Any] | None) -> list[Any]:
        extra = {"kv_transfer_params": params} if params is not None else None
        sampling = SamplingParams(
            temperature=0, max_tokens=8, ignore_eos=True, extra_args=extra
        )
        return llm.generate(prompts, sampling, use_tqdm=False)

    def step_until(metric: str, at_least: float, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while (seen := metrics(llm)).get(metric, 0.0) < at_least:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{metric} stayed at {seen.get(metric)}")
            sampling = SamplingParams(temperature=0, max_tokens=1)
            llm.generate(["hello"], sampling, use_tqdm=False)
        return seen

    say("READY")
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        try:
            if op == "generate":
                outs = generate(command["prompts"], command.get("params"))
                reply: Any = [
                    {
                        "cached": o.num_cached_tokens,
                        "tokens": list(o.outputs[0].token_ids),
                    }
                    for o in outs
                ]
            elif op == "metrics":
                reply = metrics(llm)
            elif op == "step_until":
                reply = step_until(
                    command["metric"],
                    command["at_least"],
                    command.get("timeout_s", 60.0),
                )
            elif op == "block_file_writes_after":
                block_file_writes_after(command["n"])
                reply = None
            elif op == "exit":
                llm.llm_engine.engine_core.shutdown()
                say("REPLY null")
                return
            else:
                raise ValueError(f"unknown op {op!r}")
        except Exception:
            say("ERROR " + json.dumps(traceback.format_exc()))
            continue
        say("REPLY " + json.dumps(reply))


if __name__ == "__main__":
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # before vLLM is imported
    main(json.loads(sys.argv[1]))
