"""Dispatch `python -m kvoffload.bench NAME ...` to `kvoffload.bench.NAME.main`."""

from __future__ import annotations

import importlib
import sys

from kvoffload.bench import BENCHMARKS


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help") or args[0] not in BENCHMARKS:
        print(f"usage: python -m kvoffload.bench {{{','.join(BENCHMARKS)}}} [options]")
        return 0 if args and args[0] in ("-h", "--help") else 2
    module = importlib.import_module(f"kvoffload.bench.{args[0]}")
    result: int = module.main(args[1:])
    return result


if __name__ == "__main__":
    sys.exit(main())
