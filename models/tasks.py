"""The tasks and poolings every family's heads compute (models/heads.py), named where
reading a manifest or serving an ONNX model needs them without importing torch."""

TASKS = ("embed", "classify", "ner", "qa", "fill-mask")
LABELLED = ("classify", "ner")  # the tasks whose outputs are labels' (id2label)
PER_TOKEN = ("ner", "qa", "fill-mask")  # the tasks whose output is a row per token [B, T, X]
# how an embedding model's token vectors are pooled (pool): sentence-transformers' names
POOLINGS = ("mean", "cls", "max", "mean_sqrt_len_tokens", "weightedmean")
