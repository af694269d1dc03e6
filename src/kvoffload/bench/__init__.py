"""Benchmarks: `python -m kvoffload.bench NAME [--json] ...`.

Each benchmark is a module `kvoffload.bench.NAME` with a `main(argv) -> int`. Every
benchmark prints its numbers next to a baseline measured in the same run.
"""

BENCHMARKS = (
    "gpu",
    "manager",
    "policies",
    "transfer",
    "tiers",
    "replay",
    "vllm",
    "rounds",
    "reuse_guard",
)
