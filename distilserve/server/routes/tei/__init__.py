"""Text Embeddings Inference's API over HTTP and gRPC (tei.proto), and the Hugging Face
Inference API at its root."""
