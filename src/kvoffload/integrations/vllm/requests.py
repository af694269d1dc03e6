"""A vLLM `Request` seen through kvoffload's eyes, with kvoffload's own block hashes.

vLLM's default block hash is SHA-256 over a pickle and does not cover the model, so
kvoffload computes its own canonical chain from the request's tokens: the root
covers the model fingerprint, the LoRA adapter's identity (`lora_identity`) and
`cache_salt`; multimodal inputs
enter the blocks they overlap. Hashes are extended lazily as tokens are generated.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvoffload.integrations.vllm.lora_identity import LoraIdentities
from kvoffload.keys import BlockHasher, HashRoot


class VllmRequestView:
    """Implements `kvoffload.connector.RequestInfo` over a live vLLM `Request`."""

    def __init__(
        self,
        request: Any,
        hasher: BlockHasher,
        model_fingerprint: str,
        loras: LoraIdentities,
    ) -> None:
        self._request = request
        self._hasher = hasher
        self._hashes: list[bytes] = []
        self._root = HashRoot(
            model=model_fingerprint,
            lora=loras.identity(getattr(request, "lora_request", None)),
            cache_salt=getattr(request, "cache_salt", None),
        )
        # Inputs whose tokens are placeholders for something hashed elsewhere.
        self._mm = [
            (int(f.mm_position.offset), int(f.mm_position.length), str(f.identifier))
            for f in (getattr(request, "mm_features", None) or ())
        ]
        # Prompt embeddings have no token ids to hash: such requests are not offloaded.
        self._hashable = getattr(request, "prompt_embeds", None) is None

    @property
    def request(self) -> Any:
        return self._request

    @property
    def request_id(self) -> str:
        return str(self._request.request_id)

    @property
    def kv_transfer_params(self) -> object:
        # As sent: the connector warns about a value that is not a mapping.
        return self._request.kv_transfer_params

    @property
    def num_prompt_tokens(self) -> int:
        return int(self._request.num_prompt_tokens)

    @property
    def num_tokens(self) -> int:
        return int(self._request.num_tokens)

    @property
    def block_hashes(self) -> Sequence[bytes]:
        if not self._hashable:
            return ()
        size = self._hasher.tokens_per_block
        full = self.num_tokens // size
        done = len(self._hashes)
        if full > done:
            tokens = self._request.all_token_ids
            extra = (
                [self._extra_keys(b, size) for b in range(done, full)]
                if self._mm
                else None
            )
            self._hashes += self._hasher.hash_blocks(
                tokens[: full * size],
                self._root,
                parent=self._hashes[-1] if done else None,
                start_block=done,
                extra_keys=extra,
            )
        return self._hashes

    def _extra_keys(self, block: int, size: int) -> tuple[str, ...]:
        start, end = block * size, (block + 1) * size
        return tuple(
            f"mm:{ident}:{offset}"
            for offset, length, ident in self._mm
            if offset < end and offset + length > start
        )
