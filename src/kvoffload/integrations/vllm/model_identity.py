"""What names a model in kvoffload's keys: everything that changes the KV a
prefix yields.

Equal keys must mean equal KV bytes in every engine that shares a tier (a
directory, a Redis), across restarts. The name or path of the model is not
enough: weights replaced at the same path, a `--hf-overrides` of the RoPE
scaling, or another fp8 format of the KV cache with the same size per block all
change the KV and keep the name. The identity therefore covers:

- the model's name or path, its revision, and the commit it resolved to on the
  hub (transformers records it in the config);
- the model config (architecture, RoPE, attention shape; vLLM has already
  applied any overrides), without the fields that name where and with which
  library version it was read;
- the quantization method and the KV-cache dtype;
- for a model on local disk, a digest of its weight files: names, sizes, and
  `SAMPLES_PER_FILE` reads of `SAMPLE_BYTES` spread evenly over each file.

The samples catch a new checkpoint or a fine-tune that changes weights spread
over the model; a change confined to a few small tensors can fall between them.
Setting `model_tag` names the weights instead of their path and samples (a
checkpoint version, say): engines that load the same weights from different
paths then share tiers, and whoever sets it answers for it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

# Weight files vLLM loads from a model directory (or a single GGUF file).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
SAMPLES_PER_FILE = 256
SAMPLE_BYTES = 4096


def model_identity(vllm_config: Any, model_tag: str | None = None) -> str:
    """A canonical string of everything that names the model's KV (see above)."""
    model = vllm_config.model_config
    hf_config = getattr(model, "hf_config", None)
    fields: dict[str, str] = {
        "config": config_digest(hf_config),
        "quantization": str(getattr(model, "quantization", None)),
        "kv_cache_dtype": str(getattr(vllm_config.cache_config, "cache_dtype", "")),
    }
    if model_tag is not None:
        fields["tag"] = model_tag
    else:
        fields["model"] = str(model.model)
        fields["revision"] = str(getattr(model, "revision", None) or "")
        fields["commit"] = str(getattr(hf_config, "_commit_hash", None) or "")
        fields["weights"] = weights_digest(Path(str(model.model)))
    return json.dumps(fields, sort_keys=True, separators=(",", ":"))


def config_digest(hf_config: Any) -> str:
    """SHA-256 of the model config as a dict, without the fields that say where
    and with which library version it was read (keys starting with `_`, and
    `transformers_version`), at any depth."""
    if hf_config is None:
        return ""
    to_dict = getattr(hf_config, "to_dict", None)
    raw = to_dict() if callable(to_dict) else dict(vars(hf_config))
    canonical = json.dumps(
        _without_volatile(raw), sort_keys=True, separators=(",", ":"), default=str
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def _without_volatile(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            str(k): _without_volatile(v)
            for k, v in value.items()
            if not str(k).startswith("_") and k != "transformers_version"
        }
    if isinstance(value, list | tuple):
        return [_without_volatile(v) for v in value]
    return value


def weights_digest(path: Path) -> str:
    """SHA-256 over the weight files at `path` (a directory, or one file): each
    one's name and size and `SAMPLES_PER_FILE` reads spread over it; "" where
    there are none on local disk (a hub name: its commit names the weights)."""
    if path.is_dir():
        files = sorted(
            p for p in path.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES
        )
    elif path.is_file():
        files = [path]
    else:
        return ""
    if not files:
        return ""
    digest = hashlib.sha256()
    for file in files:
        digest.update(_file_digest(file))
    return digest.hexdigest()


def _file_digest(file: Path) -> bytes:
    digest = hashlib.sha256()
    fd = os.open(file, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        digest.update(f"{file.name}\0{size}\0".encode())
        if size <= SAMPLES_PER_FILE * SAMPLE_BYTES:
            offsets = list(range(0, size, SAMPLE_BYTES))  # all of it
        else:
            step = (size - SAMPLE_BYTES) / (SAMPLES_PER_FILE - 1)
            offsets = [round(i * step) for i in range(SAMPLES_PER_FILE)]
        for offset in offsets:
            digest.update(os.pread(fd, SAMPLE_BYTES, offset))
    finally:
        os.close(fd)
    return digest.digest()
