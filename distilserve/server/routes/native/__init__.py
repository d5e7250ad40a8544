"""The native routes: /v1 (OpenAI's /v1/embeddings and /v1/models among them), their bodies."""
