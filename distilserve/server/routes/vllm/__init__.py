"""vLLM's score API (/score, /v1/score)."""
