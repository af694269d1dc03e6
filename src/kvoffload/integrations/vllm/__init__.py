"""vLLM integration: the KV connector loaded with `kv_connector_module_path`.

Placeholder until the connector lands (issue 6); `model_builder` builds the tiny
local checkpoints its tests and benchmarks run on. See docs/vllm-internals.md.
"""
