"""Adapters that plug kvoffload into inference engines (vLLM first)."""
