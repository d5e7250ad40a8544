"""A model's tokenizer, as the service uses it: the Rust tokenizer set up once per
truncation (transformers' wrapper re-configures it on every call), so that the model's
thread encodes in batches; texts, pairs and token ids to encodings; windows; TEI's tokens
and decode; fill-mask's targets and texts. TurnTokenizer batches an event loop's
requests as the model's thread batches its own."""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import Tokenizer

from distilserve.models import entities
from distilserve.models.io.manifest import Manifest, TokenizerFacts
from distilserve.models.tasks import least_max_length
from distilserve.server.core.refusals import ModelLoadError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast


class WholeIds(list):
    """A token-id input that is the model's whole input, its special tokens included (as
    TEI takes token ids, as /tokenize gives them): cut to max_length, given nothing. A
    plain list of ids (OpenAI's) is a text's tokens, which get a text's special tokens."""


@dataclass
class TokenIds:
    """A token-id input as the batcher sees an encoding."""

    ids: list[int]
    type_ids: list[int]
    overflowing: list[int] = field(default_factory=list)  # the ids cut off (max_length)


def load_tokenizer(folder: Path, manifest: Manifest,
                   ) -> tuple[Tokenizer, TokenizerFacts, PreTrainedTokenizerFast | None]:
    """A model folder's Rust tokenizer, its special tokens, and transformers' tokenizer
    where fill-mask needs its decode (a class that decodes its own way; else None). Read
    from checkpoint/tokenizer.json alone where the export found that to be transformers'
    tokenizer (the manifest's ``tokenizer``): then neither transformers nor torch is
    imported; else loaded with transformers, from that folder alone (never the Hub). A
    ModelLoadError naming the tokenizer.json that does not read, the checkpoint folder
    that is missing, or the folder where transformers does not load it."""
    checkpoint, facts = folder / "checkpoint", manifest.tokenizer
    file = checkpoint / "tokenizer.json"  # (gone: transformers makes it from vocab.txt)
    if facts is not None and file.is_file() and facts.suffice(manifest.task):
        try:
            return Tokenizer.from_file(str(file)), facts, None
        except Exception as e:
            raise ModelLoadError(f"{file}: {type(e).__name__}: {e}") from None
    if not checkpoint.is_dir():
        raise ModelLoadError(f"{checkpoint}: missing (a model folder keeps its tokenizer there, "
                             "as distilserve export writes it)")
    try:
        from transformers import AutoTokenizer  # a second or two, and torch with it

        tokenizer = AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True)
    except Exception as e:
        raise ModelLoadError(f"{folder}: {type(e).__name__}: {e}") from None
    if not tokenizer.is_fast:
        raise ModelLoadError(f"{folder}: checkpoint/ has no tokenizer.json (a fast "
                             "tokenizer); re-export it with distilserve export")
    facts = TokenizerFacts.of(tokenizer)
    hf = None if facts.suffice(manifest.task) else tokenizer
    return tokenizer.backend_tokenizer, facts, hf


# transformers' clean-up of a decoded text (PreTrainedTokenizerBase.clean_up_tokenization):
# the spaces a WordPiece decode leaves before punctuation and English contractions
CLEAN_UPS = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
             (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def clean_up_tokenization(text: str) -> str:
    """A decoded text as transformers cleans it up, replacement by replacement in its order."""
    for spaced, joined in CLEAN_UPS:
        text = text.replace(spaced, joined)
    return text


class Tokenisation:
    """One model folder's tokenizer for a task, inputs cut to ``max_length``. A
    ModelLoadError where it cannot serve the task (fill-mask without a mask token) or
    ``max_length`` leaves no room for text."""

    def __init__(self, folder: Path, manifest: Manifest, task: str, max_length: int):
        self.max_length = max_length
        # the Rust tokenizer itself, set up once per truncation below (transformers' wrapper
        # re-configures it on every call); the model's thread encodes in batches
        rust, facts, self.hf_tokenizer = load_tokenizer(folder, manifest)
        self.clean_up_spaces = facts.clean_up_tokenization_spaces  # fill-mask's texts
        self.unk_id = facts.unk_token_id
        self.cls_id = facts.cls_token_id  # QA: the token that may answer "no answer"
        self.mask_token = self.mask_id = None  # fill-mask: the token it fills
        if task == "fill-mask":
            if facts.mask_token_id is None:
                raise ModelLoadError(f"{folder}: its tokenizer has no mask token to fill")
            self.mask_token, self.mask_id = facts.mask_token, facts.mask_token_id
        spec = rust.to_str()  # its JSON, serialised once for the digest and the copies
        # models whose tokenizers are the same tokenise alike (/v1/tokenize unnamed)
        self.digest = hashlib.sha256(spec.encode()).hexdigest()
        self.word_aware = entities.TokenInfo.marks_words(rust)
        self._spec, self._copies = spec, {}  # windows()'s and pair_cuts()' tokenizers
        # transformers' default: longest_first for pairs; a question is kept whole, its
        # context cut (transformers' question-answering pipeline)
        self._strategy = "only_second" if task == "qa" else "longest_first"
        rust.no_padding()
        rust.no_truncation()
        # per truncation; "left", which few requests ask for, made when first asked for
        self.tokenizers = {None: rust}
        self.truncating("right")
        # the special tokens around one input ("[CLS] $A [SEP]"), for token-id inputs
        probe = self.tokenizers[None].encode("a")
        at = probe.special_tokens_mask.index(0)
        self.specials = (probe.ids[:at], probe.ids[at + 1:])
        least = least_max_length(self.tokenizers[None], task)
        if max_length < least:
            raise ModelLoadError(f"{folder}: its max_length, {max_length}, leaves no "
                                 "token of text beside the special tokens of an input: "
                                 f"re-export it with --max-length {least} or more")
        # the tokens of text an input may have: max_length less its special tokens
        self.room = max(0, max_length - len(self.specials[0]) - len(self.specials[1]))
        self.filler = probe.ids[at]  # a token of text, for warm-up batches

    @cached_property
    def pair_specials(self) -> int:
        """How many special tokens a pair of texts is read with ("[CLS] $A [SEP] $B [SEP]":
        3)."""
        return sum(self.tokenizers[None].encode("a", "b").special_tokens_mask)

    @cached_property
    def vocab_size(self) -> int:
        """How many token ids the tokenizer has, its added tokens counted (a token-id
        input's ids are below it): counted when first asked for, as the vocabulary is
        copied to count it."""
        return self.tokenizers[None].get_vocab_size(with_added_tokens=True)

    def truncating(self, truncation: str | None) -> Tokenizer:
        """The Rust tokenizer that cuts an input longer than max_length at its end
        ("right"), at its start ("left"), or not at all (None)."""
        tokenizer = self.tokenizers.get(truncation)
        if tokenizer is None:
            tokenizer = self.tokenizers.setdefault(truncation, self._copy(
                max_length=self.max_length, direction=truncation, strategy=self._strategy))
        return tokenizer

    def tokenize(self, texts: list, truncation: str | None) -> list:
        """Texts (or pairs) -> the Rust tokenizer's encodings, in order, cut to max_length
        at the end ("right") or the start ("left") or not at all (None); token-id inputs
        (lists of ints) get the special tokens a text would get (WholeIds none), and are cut
        the same way."""
        if not any(isinstance(t, list) for t in texts):
            return self.truncating(truncation).encode_batch(texts)
        strings = [t for t in texts if not isinstance(t, list)]
        encoded = iter(self.truncating(truncation).encode_batch(strings) if strings else [])
        return [self._from_ids(t, truncation) if isinstance(t, list) else next(encoded)
                for t in texts]

    def windows(self, texts: list, size: int, stride: int) -> list[list]:
        """Each input's encodings in windows of ``size`` tokens in all, each sharing
        ``stride`` tokens of its text with the one before, as transformers' pipelines make
        them: a text whole in its windows (token classification's stride), or a (question,
        context) pair's question whole in each and its context in windows (question
        answering). stride must be less than the room the special tokens (and a question)
        leave."""
        strategy = "only_second" if isinstance(texts[0], tuple) else "longest_first"
        tokenizer = self._kept((size, stride, strategy), max_length=size, stride=stride,
                               strategy=strategy)
        return [[encoding, *encoding.overflowing] for encoding in tokenizer.encode_batch(texts)]

    def _kept(self, key: tuple, **truncation) -> Tokenizer:
        """A copy that cuts as ``truncation`` says, kept by ``key``: a few of those clients
        asked for (windows' sizes, pairs' lengths), the rest made again."""
        tokenizer = self._copies.get(key)
        if tokenizer is None:
            if len(self._copies) >= 8:
                self._copies.clear()
            tokenizer = self._copies[key] = self._copy(**truncation)
        return tokenizer

    def _copy(self, **truncation) -> Tokenizer:
        """A copy of the tokenizer that pads nothing and cuts as ``truncation`` says
        (Tokenizer.enable_truncation's arguments)."""
        tokenizer = Tokenizer.from_str(self._spec)
        tokenizer.no_padding()
        tokenizer.enable_truncation(**truncation)
        return tokenizer

    def _from_ids(self, ids: list[int], truncation: str | None) -> TokenIds:
        whole = isinstance(ids, WholeIds)
        before, after = ([], []) if whole else self.specials
        room = self.max_length if whole else self.room
        kept, overflowing = list(ids), []
        if truncation == "right":
            kept, overflowing = kept[:room], kept[room:]
        elif truncation == "left":
            cut = max(0, len(kept) - room)
            kept, overflowing = kept[cut:], kept[:cut]
        ids = [*before, *kept, *after]
        return TokenIds(ids, [0] * len(ids), overflowing)

    def tokens(self, texts: list[str], add_special_tokens: bool) -> list[list[dict]]:
        """TEI's /tokenize: per text its tokens (id, text, character offsets, special),
        untruncated."""
        out = []
        for text, enc in zip(texts, self.tokenizers[None].encode_batch(
                texts, add_special_tokens=add_special_tokens)):
            out.append([{"id": i, "special": bool(sp),
                         "text": token if sp else text[start:stop],
                         "start": None if sp else start, "stop": None if sp else stop}
                        for i, token, (start, stop), sp in zip(
                            enc.ids, enc.tokens, enc.offsets, enc.special_tokens_mask)])
        return out

    def token_strings(self, ids: list[int]) -> list[str]:
        """Each id's token as the vocabulary spells it ("##ing")."""
        tokenizer = self.tokenizers[None]
        return [tokenizer.id_to_token(i) for i in ids]

    def count(self, text: str) -> int:
        """How many tokens ``text`` is, special tokens not counted."""
        return len(self.tokenizers[None].encode(text, add_special_tokens=False).ids)

    def counted_cuts(self, texts: list[str], most: int, truncation: str | None,
                     ) -> list[tuple[str, int]]:
        """Each text with its count of tokens of text (no special tokens), cut where it has
        more than ``most`` to its first ``most`` tokens ("right") or its last ("left"), at
        the characters where the tokens' offsets say they end or begin (_cut); None: not
        cut."""
        out = []
        for text, encoding in zip(texts, self.tokenizers[None].encode_batch(
                texts, add_special_tokens=False)):
            count = len(encoding.ids)
            if count > most and truncation is not None:
                text = self._cut(text, encoding, most, truncation)
            out.append((text, count))
        return out

    def _cut(self, text: str, encoding, most: int, truncation: str) -> str:
        """``text`` cut to at most ``most`` tokens: after its ``most``-th ("right"), or from
        the first token that begins a word among its last ``most`` ("left": a word's later
        pieces read otherwise at a text's start). A cut that reads as more tokens (within
        a word) is moved a token further in until it reads as ``most`` or fewer (none
        does: the empty text)."""
        offsets, count, words = encoding.offsets, len(encoding.ids), encoding.word_ids
        if truncation == "right":
            cuts = (text[:offsets[k - 1][1]] for k in range(most, 0, -1))
        else:
            start = count - most
            start = next((k for k in range(start, count) if words[k] != words[k - 1]), start)
            cuts = (text[offsets[k][0]:] for k in range(start, count))
        encode = self.tokenizers[None].encode
        return next((cut for cut in cuts
                     if len(encode(cut, add_special_tokens=False).ids) <= most), "")

    def pair_cuts(self, pairs: list[tuple[str, str]], total: int, side: str = "right",
                  ) -> list[tuple[str, str]]:
        """Pairs cut so that each reads as at most ``total`` tokens, its special tokens
        counted, as the Rust tokenizer's longest_first truncation at that length cuts them
        (vLLM's truncate_prompt_tokens on a cross-encoder): each text at its end ("right")
        or its start ("left"), where its kept tokens end or begin (_cut). ``total`` leaves a
        token of each text beside the pair's special tokens (pair_specials)."""
        tokenizer = self._kept(("pairs", total, side), max_length=total,
                               strategy="longest_first", direction=side)
        kept = [(e.sequence_ids.count(0), e.sequence_ids.count(1))
                for e in tokenizer.encode_batch(pairs)]
        texts = [text for pair in pairs for text in pair]
        most = [n for pair in kept for n in pair]
        cut = [self._cut(text, encoding, n, side) if len(encoding.ids) > n else text
               for text, encoding, n in zip(texts, self.tokenizers[None].encode_batch(
                   texts, add_special_tokens=False), most)]
        return list(zip(cut[::2], cut[1::2]))

    def target_ids(self, targets: list[str]) -> list[int]:
        """fill-mask's targets as token ids, as the pipeline finds them: the vocabulary's
        token, else the first token of the target's text (none: left out); each once."""
        tokenizer, ids = self.tokenizers[None], []
        for target in targets:
            if (found := tokenizer.token_to_id(target)) is None:
                tokens = tokenizer.encode(target, add_special_tokens=False).ids
                if not tokens:
                    continue
                found = tokens[0]
            ids.append(found)
        return list(dict.fromkeys(ids))

    def decode(self, ids: list[list[int]], skip_special_tokens: bool) -> list[str]:
        """TEI's /decode: each list of token ids as text."""
        return self.tokenizers[None].decode_batch(ids, skip_special_tokens=skip_special_tokens)

    def text_of(self, ids: list[int], skip_special_tokens: bool) -> str:
        """Token ids as transformers' tokenizer decodes them (fill-mask's texts, as the
        pipeline's): the Rust tokenizer's text, its spaces before punctuation cleaned up
        where the tokenizer says; or transformers' own decode, for a class with its own."""
        if self.hf_tokenizer is not None:
            return self.hf_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        text = self.tokenizers[None].decode(ids, skip_special_tokens=skip_special_tokens)
        return clean_up_tokenization(text) if self.clean_up_spaces else text


class TurnTokenizer:
    """A front end's tokenisation (the engine process's: it tokenises every request before
    sending it): the texts of the requests of one turn of its event loop that have
    ``inline`` texts or fewer tokenised together, in one call of ``text.tokenize`` on the
    loop, as the model's thread tokenises what arrived since its last batch; a request of
    more on a thread of its own, the loop going on meanwhile. A call that fails is made
    again for each request, so that a text the tokenizer refuses fails its own request."""

    def __init__(self, text: Tokenisation, inline: int):
        self.text, self.inline = text, inline
        self.waiting: list[tuple[list, str | None, asyncio.Future]] = []

    def tokenize(self, texts: list, truncation: str | None) -> asyncio.Future:
        """The texts' encodings, once made."""
        if len(texts) > self.inline:
            return asyncio.ensure_future(asyncio.to_thread(self.text.tokenize, texts,
                                                           truncation))
        loop = asyncio.get_running_loop()
        if not self.waiting:
            loop.call_soon(self._turn)
        future = loop.create_future()
        self.waiting.append((texts, truncation, future))
        return future

    def _turn(self) -> None:
        waiting, self.waiting = self.waiting, []
        for truncation in dict.fromkeys(truncation for _, truncation, _ in waiting):
            group = [(texts, future) for texts, cut, future in waiting
                     if cut == truncation and not future.done()]  # (not those cancelled)
            encoded = self._encode([texts for texts, _ in group], truncation)
            for (_, future), made in zip(group, encoded):
                if isinstance(made, Exception):
                    future.set_exception(made)
                else:
                    future.set_result(made)

    def _encode(self, requests: list[list], truncation: str | None) -> list:
        """Each request's encodings (or what its texts raised), from one call."""
        try:
            encodings = self.text.tokenize([t for texts in requests for t in texts], truncation)
        except Exception:
            return [self._alone(texts, truncation) for texts in requests]
        out, at = [], 0
        for texts in requests:
            out.append(encodings[at:at + len(texts)])
            at += len(texts)
        return out

    def _alone(self, texts: list, truncation: str | None) -> list | Exception:
        try:
            return self.text.tokenize(texts, truncation)
        except Exception as e:
            return e
