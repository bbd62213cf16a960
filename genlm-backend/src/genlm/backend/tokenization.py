"""``Token`` and ``decode_vocab``: the byte vocabulary in the form genlm-backend 0.3 documents.

The bytes come from :class:`genlm.core.Vocabulary` (one reader of tokenizers for the whole
project); this module only wraps them as :class:`Token` objects and derives the display strings.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any, Literal

from genlm.core import Vocabulary

#: Text the exactness probe encodes: letters, case, punctuation, digits and spaces.
_PROBE = "Hello, world! It's 42 degrees."


class Token(bytes):
    """A vocabulary entry: the token's bytes (it *is* a ``bytes``) and its id.

    Two ids may spell the same bytes, so a token's identity is its id: tokens hash by
    ``token_id`` and two tokens are equal when both id and bytes are. A token still compares
    equal to plain bytes with the same content, but it does not hash like them, so a dict or
    set of tokens is not found by plain bytes (use ``byte_string`` keys for that). Tokens
    order by id, as genlm-backend's do (``sorted`` gives id order).

    Args:
        token_id: the id of the token in its model's vocabulary.
        byte_string: the exact bytes the token contributes to the decoded stream.

    Attributes:
        token_id (int): the token id.
        byte_string (bytes): the bytes, as a plain ``bytes`` object (read-only).

    Raises:
        TypeError: ``token_id`` is not an integer (a float or a bool) or ``byte_string`` is
            not bytes.
    """

    token_id: int

    def __new__(cls, token_id: int, byte_string: bytes) -> Token:
        if isinstance(token_id, bool) or not isinstance(token_id, numbers.Integral):
            raise TypeError(f"token_id must be an integer, got {token_id!r}")
        if not isinstance(byte_string, bytes):
            raise TypeError(f"byte_string must be bytes, got {type(byte_string).__name__}")
        self = super().__new__(cls, byte_string)
        self.token_id = int(token_id)
        return self

    @property
    def byte_string(self) -> bytes:
        """The token's bytes as a plain ``bytes`` (read-only: they are the token)."""
        return bytes(self)

    def __hash__(self) -> int:
        return hash(self.token_id)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Token):
            return self.token_id == other.token_id and self.byte_string == other.byte_string
        return bytes.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    # Ordered by id among tokens, as genlm-backend's: sorting a vocabulary's tokens gives id
    # order. Against plain bytes, the bytes' own order applies.
    def __lt__(self, other: object) -> bool:
        return self.token_id < other.token_id if isinstance(other, Token) else NotImplemented

    def __le__(self, other: object) -> bool:
        return self.token_id <= other.token_id if isinstance(other, Token) else NotImplemented

    def __gt__(self, other: object) -> bool:
        return self.token_id > other.token_id if isinstance(other, Token) else NotImplemented

    def __ge__(self, other: object) -> bool:
        return self.token_id >= other.token_id if isinstance(other, Token) else NotImplemented

    def __repr__(self) -> str:
        return f"Token({self.token_id}, {self.byte_string!r})"

    def __reduce__(self) -> tuple[type, tuple[int, bytes]]:
        return (Token, (self.token_id, self.byte_string))

    @staticmethod
    def as_bytes(x: bytes) -> bytes:
        """The plain bytes of a :class:`Token` (its ``byte_string``) or of any bytes object.

        Args:
            x: a :class:`Token` or any object ``bytes()`` accepts.

        Returns:
            A plain ``bytes`` object with the same bytes.
        """
        return x.byte_string if isinstance(x, Token) else bytes(x)

    @staticmethod
    def is_plain_bytes(x: object) -> bool:
        """Whether ``x`` is a ``bytes`` object that is not a :class:`Token`.

        Args:
            x: any object.

        Returns:
            True for ``bytes`` (or a subclass other than :class:`Token`), else False.
        """
        return isinstance(x, bytes) and not isinstance(x, Token)


def decode_vocab(
    tokenizer: Any,
    byte2str_fallback: Literal["tokenizer", "latin1", "replace"] = "tokenizer",
) -> tuple[list[Token], list[str]]:
    """The byte and string form of every token id of a Hugging Face tokenizer.

    Args:
        tokenizer: a transformers tokenizer (fast or slow).
        byte2str_fallback: how ``str_vocab`` spells tokens whose bytes are not valid UTF-8
            (a piece of a multi-byte character): ``"tokenizer"`` (the tokenizer's name for it,
            ``convert_ids_to_tokens``: ``<0x80>``, ``Ġ``),
            ``"latin1"`` (one character per byte) or ``"replace"`` (U+FFFD).

    Returns:
        ``(byte_vocab, str_vocab)``: ``byte_vocab[i]`` is the :class:`Token` of id ``i`` (its
        exact bytes, the canonical form), ``str_vocab[i]`` a readable string for it.

    Raises:
        ValueError: the tokenizer's bytes cannot be recovered exactly (e.g. WordPiece, whose
            ``##`` pieces lose the spaces): the message starts "Could not decode byte
            representation", or ``byte2str_fallback`` is unknown.
    """
    if byte2str_fallback not in ("tokenizer", "latin1", "replace"):
        raise ValueError(
            "byte2str_fallback must be 'tokenizer', 'latin1' or 'replace', "
            f"got {byte2str_fallback!r}"
        )
    return vocab_lists(_read_vocab(tokenizer), tokenizer, byte2str_fallback)


def _read_vocab(tokenizer: Any) -> Vocabulary:
    """The tokenizer's :class:`~genlm.core.Vocabulary`, checked exact as :func:`decode_vocab`
    checks it (same errors)."""
    vocab = _unchecked_vocab(tokenizer)
    _check_exact(vocab, tokenizer)
    return vocab


def _unchecked_vocab(tokenizer: Any) -> Vocabulary:
    """The tokenizer's :class:`~genlm.core.Vocabulary`, a reading error raised as
    :func:`decode_vocab` raises it; not yet checked exact (see :func:`_check_exact`)."""
    try:
        return Vocabulary.from_tokenizer(tokenizer)
    except Exception as e:
        raise ValueError(f"Could not decode byte representation of {tokenizer!r}: {e}") from e


def vocab_lists(
    vocab: Vocabulary, tokenizer: Any, byte2str_fallback: str = "tokenizer"
) -> tuple[list[Token], list[str]]:
    """``(byte_vocab, str_vocab)`` of a core :class:`~genlm.core.Vocabulary` (see decode_vocab).

    They list the tokenizer's ids, as 0.3's ``decode_vocab(tokenizer)`` does: a model whose
    logit rows are wider than its tokenizer (Qwen2, Phi-3) has a vocabulary as wide as its
    rows, whose ids after the tokenizer's last are unused padding; those are left out here,
    while the rows keep the model's width, as in genlm-backend 0.3.1 (genlm-control slices
    such rows to ``len(byte_vocab)`` and renormalizes them).
    """
    byte_vocab = [Token(i, b) for i, b in enumerate(vocab.tokens[: _tokenizer_size(vocab)])]
    return byte_vocab, [_to_str(t, tokenizer, byte2str_fallback) for t in byte_vocab]


def _tokenizer_size(vocab: Vocabulary) -> int:
    """The number of ids up to the tokenizer's last token: the unused ids after it are a
    model's padding rows (a tokenizer's own last id is always one of its tokens)."""
    size = len(vocab)
    while size and size - 1 in vocab.unused_ids:
        size -= 1
    return size


def _to_str(token: Token, tokenizer: Any, fallback: str) -> str:
    try:
        return token.byte_string.decode("utf-8")
    except UnicodeDecodeError:
        if fallback == "latin1":
            return token.byte_string.decode("latin1")
        if fallback == "tokenizer" and tokenizer is not None:
            # The tokenizer's name for the token (``<0x80>``, ``Ġ``...): distinct per id,
            # where decoding a piece of a character gives U+FFFD for all of them.
            return tokenizer.convert_ids_to_tokens(token.token_id)
        return token.byte_string.decode("utf-8", errors="replace")


def _check_exact(vocab: Vocabulary, tokenizer: Any) -> None:
    """Raise unless the bytes of a probe text's tokens join back to the text.

    Tokenizers that prepend a space (SentencePiece ``▁``) give the text with one leading space.
    The probe keeps only the characters the tokenizer can spell (a lowercase or a protein
    alphabet without byte fallback reads the others as its unknown token, whose bytes are
    not theirs), with its words still apart, which is what a WordPiece vocabulary loses;
    where fewer than two words are left, the whole probe is judged.
    """
    encode = getattr(tokenizer, "encode", None)
    if encode is None:
        return
    probe = _PROBE
    ids: Sequence[int] = encode(probe, add_special_tokens=False)
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is not None and unk in ids:
        spellable = _spellable(probe, encode, unk)
        if len(spellable.split()) >= 2:  # else no two words to keep apart: judge it whole
            probe = spellable
            ids = encode(probe, add_special_tokens=False)
    joined = vocab.decode(ids)
    text = probe.encode("utf-8")
    if joined not in (text, b" " + text):
        raise ValueError(
            f"Could not decode byte representation of {type(tokenizer).__name__}: its tokens of "
            f"{probe!r} join to {joined!r} (e.g. a WordPiece vocabulary, which drops spaces)"
        )


def _spellable(text: str, encode: Any, unk: int) -> str:
    """``text`` without the characters the tokenizer reads as its unknown token, its words
    separated by single spaces (a normalizer may fold the runs left)."""
    kept = "".join(c for c in text if c == " " or unk not in encode(c, add_special_tokens=False))
    return " ".join(kept.split())
