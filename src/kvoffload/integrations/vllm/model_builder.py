"""Tiny random-weight Llama checkpoints and a BPE tokenizer, built locally.

Tests and benchmarks run real vLLM without a model hub: `build_model(spec)` writes a
Hugging Face checkpoint (config, safetensors, tokenizer) from fixed seeds, caches it
on disk under a directory named by the spec's parameters, and publishes it
atomically (built in a temporary directory, then renamed) so that concurrent
processes never see a half-built model.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal, NamedTuple

# Bump when the output of a build changes for the same spec, so caches rebuild.
BUILDER_VERSION = 1
MARKER_FILE = "kvoffload-model.json"
CACHE_ENV = "KVOFFLOAD_MODEL_CACHE"

Dtype = Literal["float32", "bfloat16"]
LayerType = Literal["full_attention", "sliding_attention"]

BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
PAD_TOKEN = "<|pad|>"
_CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@dataclass(frozen=True)
class ModelSpec:
    """What to build. Every field is part of the cache key.

    `layer_types` (one entry per layer) with `sliding_window` makes a hybrid model:
    vLLM then has one KV-cache group per attention type when its hybrid KV cache
    manager is on. `initializer_range` is larger than Llama's 0.02 so that greedy
    decoding has clear margins between the top logits.

    `dtype` must also be passed to vLLM (`LLM(dtype=...)`, see `BuiltModel`):
    on CPU, `dtype="auto"` downcasts a float32 checkpoint to bfloat16, and in
    bfloat16 a prefix-cache hit and a full prefill of the same prompt can give
    different greedy outputs (tied logits). Float32 keeps them identical.
    """

    name: str = "tiny-llama"
    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 512
    vocab_size: int = 4096
    max_position_embeddings: int = 8192
    dtype: Dtype = "float32"
    initializer_range: float = 0.1
    sliding_window: int | None = None
    layer_types: tuple[LayerType, ...] | None = None
    seed: int = 0
    tokenizer_corpus_words: int = 200_000

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ValueError(
                f"name: {self.name!r} must be a non-empty plain directory name"
            )
        for attr in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "intermediate_size",
            "max_position_embeddings",
        ):
            value = getattr(self, attr)
            if type(value) is not int or value <= 0:
                raise ValueError(f"{attr}: {value!r} must be a positive int")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size: {self.hidden_size} must be divisible by "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_key_value_heads: {self.num_key_value_heads} must divide "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if self.vocab_size < 512:
            raise ValueError(f"vocab_size: {self.vocab_size} must be at least 512")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(
                f"dtype: {self.dtype!r} is not one of 'float32', 'bfloat16'"
            )
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_hidden_layers:
                raise ValueError(
                    f"layer_types: {len(self.layer_types)} entries, expected one per "
                    f"layer ({self.num_hidden_layers})"
                )
            if "sliding_attention" in self.layer_types and not self.sliding_window:
                raise ValueError(
                    "sliding_window: required when layer_types has 'sliding_attention'"
                )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def cache_key(self) -> str:
        """Directory name: readable name plus a digest of every parameter."""
        payload = json.dumps(
            {"builder_version": BUILDER_VERSION, **asdict(self)}, sort_keys=True
        )
        digest = hashlib.sha256(payload.encode("utf-8")).hexdigest()[:12]
        return f"{self.name}-{digest}"


TINY = ModelSpec()
"""Four layers, hidden 256, two KV heads: loads in vLLM in seconds."""

BENCH = ModelSpec(
    name="bench-llama",
    hidden_size=1024,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=2,
    intermediate_size=2816,
)
"""Large enough that prefill costs real time on a few CPU cores (TTFT benchmark)."""

TINY_HYBRID = replace(
    TINY,
    name="tiny-hybrid",
    sliding_window=64,
    layer_types=(
        "sliding_attention",
        "full_attention",
        "sliding_attention",
        "full_attention",
    ),
)
"""Sliding-window and full-attention layers: two KV-cache groups in vLLM."""


def default_cache_dir() -> Path:
    """`$KVOFFLOAD_MODEL_CACHE`, else `<repo>/.cache/models`, else the user cache."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    for parent in Path(__file__).resolve().parents:
        if (parent / "pyproject.toml").is_file() and (parent / "src").is_dir():
            return parent / ".cache" / "models"
    return Path.home() / ".cache" / "kvoffload" / "models"


class BuiltModel(NamedTuple):
    """A complete checkpoint directory and the spec it was built from."""

    path: Path
    spec: ModelSpec

    def vllm_args(self) -> dict[str, str]:
        """`model`, `tokenizer` and `dtype` for vLLM's `LLM` (or its engine args)."""
        path = str(self.path)
        return {"model": path, "tokenizer": path, "dtype": self.spec.dtype}


def is_built(path: Path) -> bool:
    """Whether `path` holds a complete build (the marker is written last)."""
    return (path / MARKER_FILE).is_file()


def build_model(spec: ModelSpec = TINY, cache_dir: Path | None = None) -> BuiltModel:
    """The checkpoint for `spec` under `cache_dir`, built first if absent.

    Its directory serves as both `model=` and `tokenizer=` of vLLM's `LLM`. Safe
    to call from several threads or processes at once: one builds while the others
    wait on a lock file, and a reader never sees a partial directory.
    """
    root = cache_dir if cache_dir is not None else default_cache_dir()
    key = spec.cache_key()
    final = root / key
    if is_built(final):
        return BuiltModel(final, spec)
    root.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(root / f".{key}.lock"):
        if is_built(final):
            return BuiltModel(final, spec)
        # Holding the lock, anything else under this key is debris of a killed
        # builder (a complete build is renamed into place with its marker).
        for debris in root.glob(f".tmp-{key}-*"):
            shutil.rmtree(debris, ignore_errors=True)
        if final.exists():
            shutil.rmtree(final)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=root))
        try:
            _write_checkpoint(spec, tmp)
            tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return BuiltModel(final, spec)


@contextlib.contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def synthetic_words(num_words: int, seed: int = 0) -> list[str]:
    """Deterministic pseudo-English words (Zipf-like), for corpora and prompts."""
    rng = random.Random(seed)
    lexicon = _lexicon()
    weights = [1.0 / (rank + 1) for rank in range(len(lexicon))]
    return rng.choices(lexicon, weights=weights, k=num_words)


def synthetic_text(num_words: int, seed: int = 0) -> str:
    """Sentences of `synthetic_words`; distinct seeds give unrelated texts."""
    rng = random.Random(seed ^ 0x5EED)
    words = synthetic_words(num_words, seed)
    out: list[str] = []
    sentence_left = 0
    for word in words:
        if sentence_left == 0:
            sentence_left = rng.randint(5, 16)
            word = word.capitalize()
        sentence_left -= 1
        out.append(word + ("." if sentence_left == 0 else ""))
    return " ".join(out)


def _lexicon() -> list[str]:
    rng = random.Random(1234)
    onsets = ["", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s"]
    onsets += ["t", "v", "w", "st", "tr", "pl", "gr", "ch", "sh", "th", "br"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "io"]
    codas = ["", "n", "r", "s", "t", "l", "m", "nd", "st", "ng", "ck"]
    words: set[str] = set()
    while len(words) < 3000:
        syllables = rng.choice((1, 1, 2, 2, 2, 3, 3, 4))
        words.add(
            "".join(
                rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas)
                for _ in range(syllables)
            )
        )
    lexicon = sorted(words)
    rng.shuffle(lexicon)
    return lexicon + [str(n) for n in range(100)]


def _write_checkpoint(spec: ModelSpec, path: Path) -> None:
    tokens = _write_tokenizer(spec, path)
    _write_model(spec, tokens, path)
    marker = {"builder_version": BUILDER_VERSION, "spec": asdict(spec)}
    (path / MARKER_FILE).write_text(json.dumps(marker, indent=2, sort_keys=True))


class _TokenizerInfo(NamedTuple):
    vocab_size: int
    bos_id: int
    eos_id: int
    pad_id: int


def _write_tokenizer(spec: ModelSpec, path: Path) -> _TokenizerInfo:
    """Trains a byte-level BPE tokenizer on synthetic text and saves it."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    text = synthetic_text(spec.tokenizer_corpus_words, seed=spec.seed)
    lines = [text[i : i + 2000] for i in range(0, len(text), 2000)]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=[BOS_TOKEN, EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(lines, trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS_TOKEN)
    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    pad_id = tokenizer.token_to_id(PAD_TOKEN)
    assert bos_id is not None and eos_id is not None and pad_id is not None
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
        special_tokens=[(BOS_TOKEN, bos_id)],
    )
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=spec.max_position_embeddings,
    )
    fast.chat_template = _CHAT_TEMPLATE
    fast.save_pretrained(str(path))
    # transformers 5 writes its own class name, which transformers 4 (the CUDA
    # builds of vLLM) cannot resolve; both load the generic fast tokenizer.
    config_path = path / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text())
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(tokenizer_config, indent=2, sort_keys=True))
    return _TokenizerInfo(
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
        bos_id=bos_id,
        eos_id=eos_id,
        pad_id=pad_id,
    )


def _write_model(spec: ModelSpec, tokens: _TokenizerInfo, path: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=tokens.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.initializer_range,
        bos_token_id=tokens.bos_id,
        eos_token_id=tokens.eos_id,
        pad_token_id=tokens.pad_id,
        tie_word_embeddings=False,
    )
    if spec.layer_types is not None:
        # Hugging Face's Llama ignores these; vLLM's Llama reads them per layer.
        config.layer_types = list(spec.layer_types)
        config.sliding_window = spec.sliding_window
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    model.to(getattr(torch, spec.dtype))
    model.config.dtype = spec.dtype
    model.save_pretrained(str(path))
