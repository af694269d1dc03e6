"""How long an engine step and a transfer take, for the engine model and replay.

A deliberately small analytical model: prefill costs a fixed time per token plus an
attention term that grows with the context each token attends to; a step that
decodes costs a fixed time plus a little per sequence; a transfer moves KV bytes
over a link of fixed bandwidth with a fixed start-up latency. The defaults describe
an 8B-parameter model in bf16 (128 KiB of KV per token) on one modern data-centre
GPU with a PCIe 5 host link; override them to describe yours.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class TimeModel:
    """Seconds per unit of engine work; all fields must be finite and >= 0, and
    the link's bandwidth > 0 (NaN would keep a replay's clock from advancing)."""

    prefill_s_per_token: float = 6.0e-5
    attention_s_per_token_context: float = 1.3e-9
    decode_step_s: float = 0.012
    decode_s_per_sequence: float = 5.0e-5
    step_overhead_s: float = 0.002
    kv_bytes_per_token: int = 131_072
    transfer_bytes_per_s: float = 25e9
    transfer_latency_s: float = 5e-5

    def __post_init__(self) -> None:
        for name, value in self.__dict__.items():
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not number or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.transfer_bytes_per_s == 0:
            raise ValueError("transfer_bytes_per_s must be > 0, got 0")

    def prefill_seconds(self, num_tokens: int, context_start: int) -> float:
        """Computing `num_tokens` prompt tokens after `context_start` cached ones."""
        if num_tokens <= 0:
            return 0.0
        mean_context = context_start + (num_tokens + 1) / 2
        return num_tokens * (
            self.prefill_s_per_token + self.attention_s_per_token_context * mean_context
        )

    def step_seconds(self, prefill_seconds: float, num_decoding: int) -> float:
        """One engine step: its prefill work plus one token for each decoding sequence."""
        decode = (
            self.decode_step_s + self.decode_s_per_sequence * num_decoding
            if num_decoding
            else 0.0
        )
        return self.step_overhead_s + prefill_seconds + decode

    def transfer_seconds(self, num_tokens: int) -> float:
        """Moving the KV of `num_tokens` tokens between device and host."""
        return (
            self.transfer_latency_s
            + num_tokens * self.kv_bytes_per_token / self.transfer_bytes_per_s
        )
