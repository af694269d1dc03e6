"""A vLLM `Request` seen through kvoffload's eyes, with kvoffload's own block hashes.

vLLM's default block hash is SHA-256 over a pickle and does not cover the model, so
kvoffload computes its own canonical chain from the request's tokens: the root
covers the model fingerprint, the LoRA adapter's identity (`lora_identity`) and
`cache_salt`; multimodal inputs enter the blocks they overlap, by the name vLLM
gives them. Hashes are extended lazily as tokens are generated, and follow
vLLM's one rewrite of a request's tokens: a streaming-input session taking its
next input.

A request whose tokens do not say what it computes has no hashes, and so is not
offloaded: prompt embeddings, and multimodal inputs on an engine that does not
name them by their content (`EngineShape.mm_by_content`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvoffload.integrations.vllm.lora_identity import LoraIdentities
from kvoffload.keys import BlockHasher, HashRoot

# Why a request has no block hashes (`VllmRequestView.not_offloaded_because`).
PROMPT_EMBEDS = "its prompt is embeddings, with no token ids to hash"
MM_NOT_BY_CONTENT = (
    "vLLM names its multimodal inputs by a per-process counter, not their "
    "content (prefix caching and the multimodal processor cache are both off), "
    "so another image could get its keys; set mm_processor_cache_gb above 0 or "
    "enable prefix caching to offload them"
)


class VllmRequestView:
    """Implements `kvoffload.connector.RequestInfo` over a live vLLM `Request`.

    `mm_by_content`: whether the engine names multimodal inputs by their content
    (`EngineShape.mm_by_content`); if not, a request with one has no block hashes,
    a streaming-input session from the input that brings one.
    """

    def __init__(
        self,
        request: Any,
        hasher: BlockHasher,
        model_fingerprint: str,
        loras: LoraIdentities,
        mm_by_content: bool = True,
    ) -> None:
        self._request = request
        self._hasher = hasher
        self._hashes: list[bytes] = []
        # A streaming-input session's prompt grows with each input it takes.
        self._resumable = bool(getattr(request, "resumable", False))
        self._prompt_tokens = int(request.num_prompt_tokens) if self._resumable else 0
        self._kept: int | None = None
        self._root = HashRoot(
            model=model_fingerprint,
            lora=loras.identity(getattr(request, "lora_request", None)),
            cache_salt=getattr(request, "cache_salt", None),
        )
        # Inputs whose tokens are placeholders for something hashed elsewhere.
        self._mm = _mm_spans(request)
        self._mm_by_content = mm_by_content
        self._unhashable: str | None = (
            PROMPT_EMBEDS
            if getattr(request, "prompt_embeds", None) is not None
            else self._mm_unhashable()
        )

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
    def not_offloaded_because(self) -> str | None:
        """Why the request has no block hashes (it is not offloaded), or `None`."""
        if self._resumable:
            self._follow_rewrite()
        return self._unhashable

    @property
    def block_hashes(self) -> Sequence[bytes]:
        if self._resumable:
            self._follow_rewrite()
        if self._unhashable is not None:
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

    def take_rewrite(self) -> int | None:
        """The tokens kept by the rewrites of the request's tokens since the last
        call, or `None` if there was none.

        vLLM rewrites only a streaming-input session (a resumable request): when
        it takes its next input, its tokens from `num_computed_tokens` on (the
        last sampled token) are replaced by the input, which joins the prompt.
        The view's hashes follow at once; the connector is told with this.
        """
        if self._resumable:
            self._follow_rewrite()
        kept, self._kept = self._kept, None
        return kept

    def _follow_rewrite(self) -> None:
        """Drop the hashes of blocks past the tokens a rewrite kept.

        A rewrite extends the prompt, or, with no input and no output kept, only
        drops the sampled token; it happens between steps, while the request's
        `num_computed_tokens` still counts the tokens kept.
        """
        request = self._request
        prompt, size = int(request.num_prompt_tokens), self._hasher.tokens_per_block
        if (
            prompt == self._prompt_tokens
            and len(self._hashes) * size <= self.num_tokens
        ):
            return
        kept = min(int(getattr(request, "num_computed_tokens", 0)), self.num_tokens)
        self._prompt_tokens = prompt
        self._kept = kept if self._kept is None else min(self._kept, kept)
        del self._hashes[kept // size :]
        # Its next input may bring images of its own.
        self._mm = _mm_spans(request)
        self._unhashable = self._unhashable or self._mm_unhashable()

    def _mm_unhashable(self) -> str | None:
        # A name that is not the content's would give another image these keys.
        return MM_NOT_BY_CONTENT if self._mm and not self._mm_by_content else None

    def _extra_keys(self, block: int, size: int) -> tuple[str, ...]:
        start, end = block * size, (block + 1) * size
        return tuple(
            f"mm:{ident}:{offset}"
            for offset, length, ident in self._mm
            if offset < end and offset + length > start
        )


def _mm_spans(request: Any) -> list[tuple[int, int, str]]:
    """(offset, length, identifier) of the request's multimodal inputs."""
    return [
        (int(f.mm_position.offset), int(f.mm_position.length), str(f.identifier))
        for f in (getattr(request, "mm_features", None) or ())
    ]
