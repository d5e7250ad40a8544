"""Token ids in another vocabulary than the served model's: OpenAI's ``cl100k_base`` and
``o200k_base``, which clients that tokenise with tiktoken before they send (LangChain's
OpenAIEmbeddings by default) put in ``/v1/embeddings``' input. They are read back into
text offline, from the tables the bpe-openai package ships, and that text is embedded."""

from __future__ import annotations

FOREIGN = ("cl100k_base", "o200k_base")


class Foreign:
    """One of FOREIGN: which ids it has, and the text a list of them spells."""

    def __init__(self, name: str):
        try:
            import bpe_openai
        except ImportError as e:
            raise ImportError(f"token ids in {name} need the token-ids extra (pip install "
                              f"-c constraints.txt 'distilserve[token-ids]'): {e}") from None
        self.name = name
        self._encoding = bpe_openai.get_encoding(name)
        self.size = self._encoding.max_token_value + 1  # ids 0 to size - 1

    def outside(self, ids: list[int]) -> int | None:
        """The first of ``ids`` that is not one of this vocabulary's, or None."""
        return next((t for t in ids if not 0 <= t < self.size), None)

    def text(self, ids: list[int]) -> str:
        """What ``ids`` spell (bytes that end mid-character: U+FFFD, as tiktoken decodes)."""
        return self._encoding.decode(ids)
