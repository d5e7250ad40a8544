"""The tasks and poolings every family's heads compute (distilserve/models/heads.py), named where
reading a manifest or serving an ONNX model needs them without importing torch."""

TASKS = ("embed", "classify", "ner", "qa", "fill-mask")
LABELLED = ("classify", "ner")  # the tasks whose outputs are labels' (id2label)
PER_TOKEN = ("ner", "qa", "fill-mask")  # the tasks whose output is a row per token [B, T, X]
PAIRED = ("classify", "qa")  # the tasks whose inputs may be two texts (a question, a context)
# how an embedding model's token vectors are pooled (pool): sentence-transformers' names
POOLINGS = ("mean", "cls", "max", "mean_sqrt_len_tokens", "weightedmean")


def least_max_length(tokenizer, task: str) -> int:
    """The shortest max_length that leaves each text of an input a token: the special
    tokens a ``tokenizers.Tokenizer`` puts around a text (around a pair, for the tasks
    that take pairs) and one token of each text. Under it, every text is cut to nothing
    (an embedding model gives any text the same vector) or cannot be cut at all."""
    processor = tokenizer.post_processor
    specials = processor.num_special_tokens_to_add if processor else lambda pair: 0
    return max(specials(False) + 1, specials(True) + 2 if task in PAIRED else 0)
