"""Retention hints derived from a trace: what an application that knows its
conversations would send (`kvoffload replay --hints MODE`).

A trace carries no hints, so the planner derives them from the trace itself. A
request's *next turn* is the first later request that continues its
conversation: one whose leading run of chunks seen before goes past the first
and ends in a chunk this request was the last to hold, unless the trace goes on
from that chunk in `COMMON_FANOUT` or more ways (the end of a prefix many
conversations share, such as a system prompt; the bundled trace's is its first
hash block, which every request holds), the notion of docs/policies.md ("Why 0.25 at 5,859 chunks is out of
reach online"). Each mode gives every request its `kv_retention_s`:

- `none`: no hint (today's replay, figure for figure);
- `oracle`: the seconds until its next turn, 0 for a last turn: an application
  that knows when the user will type;
- `session:S`: S seconds while the conversation continues, 0 at its last turn:
  a front-end that knows a session is open, not when the user types;
- `noisy:P[:S]`: `session:S` (S 300 by default) with each request's
  continue-or-not flipped with probability P (a fixed seed): a front-end that
  guesses;
- `all:S`: every request claims S seconds: the lazy application that hints
  everything (the bound on a tier's hinted share is what protects the cache).

Seconds are the trace's: with arrivals stretched (`--time-scale`), so are they.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from kvoffload.policies.retention import (
    DEFAULT_MAX_HINTED_SHARE,
    check_max_hinted_share,
)
from kvoffload.replay.workload import Workload

MODES = ("none", "oracle", "session", "noisy", "all")
NOISY_DEFAULT_S = 300.0
NOISY_SEED = 0
COMMON_FANOUT = 16
"""A chunk followed by this many different chunks across the trace ends a shared
prefix; a conversation's own history branches far less (on the bundled trace 16
and more give the same next turns, 8 changes 56 of 4,645)."""
MAX_HINT_S = 86_400.0 * 365
"""A year: longer hints are refused (a replay's clock must stay finite)."""


@dataclass(frozen=True)
class HintMode:
    """How the planner derives each request's retention hint (see the module)."""

    kind: str = "none"
    seconds: float = 0.0
    flip: float = 0.0
    scale: float = 1.0
    """Trace seconds to replayed seconds: the arrival stretch."""

    def __post_init__(self) -> None:
        if self.kind not in MODES:
            raise ValueError(f"hints: {self.kind!r} is not one of {MODES}")

    @property
    def label(self) -> str:
        """The mode as `--hints` takes it."""
        if self.kind in ("none", "oracle"):
            return self.kind
        if self.kind == "noisy":
            return f"noisy:{self.flip:g}:{self.seconds:g}"
        return f"{self.kind}:{self.seconds:g}"

    def hints(self, workload: Workload) -> tuple[float | None, ...] | None:
        """Each request's `kv_retention_s` in replayed seconds (`None`: no hint),
        or `None` for mode `none`."""
        if self.kind == "none":
            return None
        if self.kind == "all":
            return (self.seconds * self.scale,) * len(workload)
        gaps = next_turn_gaps(workload)
        if self.kind == "oracle":
            return tuple(0.0 if gap is None else gap for gap in gaps)
        rng = random.Random(NOISY_SEED)
        hold = self.seconds * self.scale
        out: list[float | None] = []
        for gap in gaps:
            continues = gap is not None
            if self.kind == "noisy" and rng.random() < self.flip:
                continues = not continues
            out.append(hold if continues else 0.0)
        return tuple(out)


NO_HINTS = HintMode()


def next_turn_gaps(workload: Workload) -> list[float | None]:
    """Seconds from each request to its next turn (`None`: its last turn)."""
    block = workload.hash_block_tokens
    prompts = [r.hashes[: r.num_prompt_blocks(block)] for r in workload.requests]
    common = _branch_points(prompts)
    holder: dict[bytes, int] = {}
    child: dict[int, int] = {}
    for j, prompt in enumerate(prompts):
        seen = 0
        while seen < len(prompt) and prompt[seen] in holder:
            seen += 1
        if seen > 1 and prompt[seen - 1] not in common:
            child.setdefault(holder[prompt[seen - 1]], j)
        holder.update(dict.fromkeys(prompt, j))
    requests = workload.requests
    return [
        requests[child[i]].arrival - r.arrival if i in child else None
        for i, r in enumerate(requests)
    ]


def _branch_points(prompts: Sequence[Sequence[bytes]]) -> set[bytes]:
    """Chunks the trace continues in `COMMON_FANOUT` or more ways: the end of a
    prefix many conversations share, not a turn of one."""
    after: dict[bytes, set[bytes]] = {}
    common: set[bytes] = set()
    for prompt in prompts:
        for here, nxt in pairwise(prompt):
            if here in common:
                continue
            ways = after.setdefault(here, set())
            ways.add(nxt)
            if len(ways) >= COMMON_FANOUT:
                common.add(here)
                del after[here]
    return common


def parse_hint_mode(text: str) -> HintMode:
    """`--hints`'s value: none, oracle, session:S, noisy:P[:S] or all:S."""
    kind, _, rest = text.partition(":")
    args = rest.split(":") if rest else []
    usage = (
        f"{text[:60]!r} is not a hint mode: none, oracle, session:S, noisy:P[:S] "
        f"or all:S (S seconds in (0, {MAX_HINT_S:g}], P a probability in [0, 1])"
    )
    try:
        if kind in ("none", "oracle") and not args:
            return HintMode(kind)
        if kind in ("session", "all") and len(args) == 1:
            return HintMode(kind, _seconds(args[0]))
        if kind == "noisy" and len(args) in (1, 2):
            seconds = _seconds(args[1]) if len(args) == 2 else NOISY_DEFAULT_S
            return HintMode(kind, seconds, _probability(args[0]))
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(usage)


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 < value <= MAX_HINT_S:  # NaN fails too
        raise ValueError(text)
    return value


def _probability(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise ValueError(text)
    return value


def _share(text: str) -> float:
    try:
        return check_max_hinted_share(float(text), "--max-hinted-share")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            str(exc).removeprefix("--max-hinted-share: ")
        ) from None


def add_hint_arguments(parser: argparse.ArgumentParser) -> None:
    """`--hints` and `--max-hinted-share` (the replay's additions for hints)."""
    parser.add_argument(
        "--hints",
        type=parse_hint_mode,
        action="append",
        dest="hint_modes",
        metavar="MODE",
        help="retention hints derived from the trace, as an application that "
        "knows its conversations would send them: none, oracle "
        "(seconds to the next turn), session:S (S while the conversation "
        "continues, 0 at its last turn), noisy:P[:S] (session's decision "
        "flipped with probability P), all:S (every request claims S); given "
        "more than once, each mode is replayed, and with none among them a "
        "table shows what each is worth (default: none)",
    )
    parser.add_argument(
        "--max-hinted-share",
        type=_share,
        default=None,
        metavar="SHARE",
        help="the share of each tier hints may hold (0 to 1; default "
        f"{DEFAULT_MAX_HINTED_SHARE:g}, as in the connector)",
    )


def hint_modes(args: argparse.Namespace) -> list[HintMode]:
    """The modes `--hints` asked for, each once, in the order given (`none`
    when it was not given); `args.hints` is set to the first."""
    modes = list(dict.fromkeys(getattr(args, "hint_modes", None) or [NO_HINTS]))
    args.hint_modes = modes
    args.hints = modes[0]
    return modes


def hint_settings(
    args: argparse.Namespace, scale: float, mode: HintMode | None = None
) -> dict[str, Any]:
    """`ReplaySettings` keywords for the hint options, seconds stretched like
    the arrivals: `mode`, or the first `--hints` mode."""
    if mode is None:
        mode = getattr(args, "hints", NO_HINTS)
    out: dict[str, Any] = {"hints": _scaled(mode, scale)}
    share = getattr(args, "max_hinted_share", None)
    if share is not None:
        out["max_hinted_share"] = share
    return out


def _scaled(mode: HintMode, scale: float) -> HintMode:
    return HintMode(mode.kind, mode.seconds, mode.flip, scale)


def hint_title(modes: Sequence[HintMode]) -> str:
    """What the report says of the modes that ran."""
    if all(m.kind == "none" for m in modes):
        return "no retention hints"
    return (
        f"retention hints {', '.join(m.label for m in modes)} (derived from the "
        "trace: what an application that knows its conversations would send)"
    )


def hinted_params(
    hints: Sequence[float | None] | None, index: int
) -> dict[str, float] | None:
    """The `kv_transfer_params` of request `index` under `hints`."""
    if hints is None:
        return None
    hint = hints[index]
    return None if hint is None else {"kv_retention_s": hint}
