"""Cohere's API (v1 and v2 embed, v2 rerank)."""
