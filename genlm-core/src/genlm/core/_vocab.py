"""Byte vocabularies: the exact bytes every token id of a model contributes to text.

Byte-level samplers, tries and constraints work on bytes, not on token strings, so every
tokenizer family has to be reduced to one table ``tokens[id] -> bytes``. The table is read
from the tokenizer's own vocabulary (never by reloading a tokenizer by name, and never by
calling ``decode([i])`` per id, which mangles byte-fallback pieces and strips spaces).

This module imports only the standard library, numpy and attrs. transformers, tokenizers and
tiktoken are recognised by duck typing and never imported here.
"""

from __future__ import annotations

import json
import logging
import operator
import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import accumulate
from pathlib import Path
from typing import Any, NamedTuple

import attrs
import numpy as np

__all__ = ["Vocabulary"]

logger = logging.getLogger(__name__)

#: Decoders whose output depends on a token's neighbours (a WordPiece ``##`` piece joins its
#: word, a BPE ``</w>`` suffix becomes a space except at the end): no token has bytes of its
#: own, so such a vocabulary holds the pieces' raw text.
_NOT_EXACT_DECODERS = {"WordPiece", "BPEDecoder", "CTC"}

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_SPIECE_SPACE = "\u2581"  # "▁", SentencePiece's stand-in for a space


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from each byte to a printable character (its ``encoder.py``)."""
    bs = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


# Byte-level tokens are mapped with str.translate then latin-1 encoding: both run in C, which
# keeps Llama 3's 128k tokens well under a second.
_BYTE_LEVEL_TRANSLATE = {ord(ch): b for b, ch in _bytes_to_unicode().items()}
# A character outside the 256-character alphabet, a space or a control character included:
# those below U+0100 would pass translate unchanged and encode as latin-1 without error.
_NOT_BYTE_LEVEL = re.compile(f"[^{re.escape(''.join(_bytes_to_unicode().values()))}]")


def _byte_level_bytes(token: str) -> bytes:
    """Bytes of a GPT-2 style byte-level token string."""
    if _NOT_BYTE_LEVEL.search(token):
        # Not a byte-level string: the token is literal text, e.g. one added by hand to the
        # vocabulary; the ByteLevel decoder writes such a token as its UTF-8, whole.
        return token.encode("utf-8")
    return token.translate(_BYTE_LEVEL_TRANSLATE).encode("latin-1")


def _byte_level_many(tokens: list[str]) -> list[bytes]:
    """Bytes of many byte-level tokens: one translate and one encode over their concatenation."""
    joined = "".join(tokens)
    if _NOT_BYTE_LEVEL.search(joined):
        return [_byte_level_bytes(t) for t in tokens]
    data = joined.translate(_BYTE_LEVEL_TRANSLATE).encode("latin-1")
    # Every character became one byte, so character offsets are byte offsets.
    ends = list(accumulate(map(len, tokens)))
    return [data[start:end] for start, end in zip([0, *ends], ends)]


def _sentencepiece_bytes(token: str, space: str, byte_fallback: bool) -> bytes:
    """Bytes of a SentencePiece piece: ``<0xNN>`` is one raw byte and ``space`` is b" "."""
    if byte_fallback and len(token) == 6:
        m = _BYTE_PIECE.fullmatch(token)
        if m:
            return bytes([int(m.group(1), 16)])
    return token.replace(space, " ").encode("utf-8")


@attrs.frozen(slots=False)
class _Scheme:
    """How a tokenizer family spells bytes in its token strings."""

    kind: str  # "byte_level", "sentencepiece" or "plain" (text or bytes as they are)
    space: str = _SPIECE_SPACE  # sentencepiece only: the character standing for b" "
    byte_fallback: bool = False  # sentencepiece only: ``<0xNN>`` pieces are raw bytes

    def to_bytes(self, tokens: list[str]) -> list[bytes]:
        """Bytes of each token string."""
        if self.kind == "byte_level":
            return _byte_level_many(tokens)
        if self.kind == "sentencepiece":
            return [_sentencepiece_bytes(t, self.space, self.byte_fallback) for t in tokens]
        # A plain piece is its text, or its bytes already (a slow tokenizer wrapping
        # tiktoken, Qwen-1's, names its pieces by their bytes).
        return [t if type(t) is bytes else t.encode("utf-8") for t in tokens]


def _components(node: Any) -> Iterator[dict]:
    """Yield a tokenizers.json component and, recursively, the members of its Sequence."""
    if not isinstance(node, dict):
        return
    yield node
    for key in (
        "decoders",
        "normalizers",
        "pretokenizers",
        "pre_tokenizers",
        "processors",
    ):
        for child in node.get(key) or ():
            yield from _components(child)


def _scheme_from_spec(spec: Mapping[str, Any]) -> _Scheme:
    """Pick the byte spelling from a tokenizer.json's decoder, pre-tokenizer, normalizer, model."""
    decoder = list(_components(spec.get("decoder")))
    pre = list(_components(spec.get("pre_tokenizer")))
    normalizer = list(_components(spec.get("normalizer")))
    model = spec.get("model") or {}
    types = {c.get("type") for c in decoder + pre}
    inexact = sorted(types & _NOT_EXACT_DECODERS)
    if inexact:
        logger.warning(
            "the tokenizer's decoder (%s) is not byte-exact: its tokens' bytes are their raw "
            "text, which does not join to the decoded text (a byte-level LM over it is wrong)",
            ", ".join(inexact),
        )
    byte_fallback = bool(model.get("byte_fallback")) or "ByteFallback" in types
    if "ByteLevel" in types:
        return _Scheme("byte_level")
    for c in decoder + pre:
        if c.get("type") == "Metaspace":
            return _Scheme("sentencepiece", c.get("replacement", _SPIECE_SPACE), byte_fallback)
    for c in decoder:  # Llama 2 style: Replace("▁", " ") in the decoder
        pattern = (c.get("pattern") or {}).get("String")
        if c.get("type") == "Replace" and c.get("content") == " " and pattern:
            return _Scheme("sentencepiece", pattern, byte_fallback)
    for c in normalizer:  # ... or Replace(" ", "▁") in the normalizer
        pattern = (c.get("pattern") or {}).get("String")
        if c.get("type") == "Replace" and pattern == " " and c.get("content"):
            return _Scheme("sentencepiece", c["content"], byte_fallback)
    if byte_fallback:
        return _Scheme("sentencepiece", _SPIECE_SPACE, True)
    return _Scheme("plain")


def _guess_scheme(tokens: Iterable[str | None]) -> _Scheme:
    """Guess the byte spelling from the token strings alone (slow tokenizers of unknown class)."""
    toks = [t for t in tokens if t]
    present = set(toks)
    if sum(f"<0x{b:02X}>" in present for b in range(256)) == 256:
        return _Scheme("sentencepiece", _SPIECE_SPACE, True)
    alphabet = set(_bytes_to_unicode().values())
    if "Ġ" in "".join(toks[:5000]) and all(
        set(t) <= alphabet for t in toks if not t.startswith("<")
    ):
        return _Scheme("byte_level")
    if any(_SPIECE_SPACE in t for t in toks):
        return _Scheme("sentencepiece", _SPIECE_SPACE, False)
    return _Scheme("plain")


def _json_id(value: Any, token: object) -> int:
    """A token id read from tokenizer.json: a non-negative integer. (A negative one, used as
    an index, would overwrite the token that many places from the end of the table.)

    Raises:
        ValueError: it is not one (a negative number, a float, a string, a bool).
    """
    if value.__class__ is not int or value < 0:
        raise ValueError(
            f"tokenizer.json: token {token!r} has id {value!r}; ids are non-negative integers"
        )
    return value


def _model_vocab(model: Any) -> dict[int, str]:
    """Map id to token string for a tokenizer.json ``model`` (Unigram keeps a list of pairs).

    Raises:
        ValueError: the model, its vocabulary or an id in it is malformed.
    """
    if not isinstance(model, Mapping):
        raise ValueError(f"tokenizer.json: 'model' is {model!r:.60}, not an object")
    vocab = model.get("vocab") or {}
    if isinstance(vocab, list):
        for entry in vocab:
            if not (isinstance(entry, list) and entry and type(entry[0]) is str):
                raise ValueError(
                    f"tokenizer.json: the Unigram vocab entry {entry!r:.60} is not a "
                    "[piece, score] pair"
                )
        return {i: entry[0] for i, entry in enumerate(vocab)}
    if not isinstance(vocab, Mapping):
        raise ValueError(f"tokenizer.json: the model's 'vocab' is {vocab!r:.60}, not an object")
    tokens = {_json_id(i, tok): tok for tok, i in vocab.items()}
    if len(tokens) < len(vocab):
        _refuse_shared_ids(vocab.items())
    return tokens


def _refuse_shared_ids(vocab: Iterable[tuple[str, int]]) -> None:
    """Raise for a vocabulary giving two tokens one id: the tokenizers library then decodes
    the id to either of them, from one process to the next, so no reading is right.

    Raises:
        ValueError: naming the first two tokens that share an id.
    """
    seen: dict[int, str] = {}
    for tok, i in sorted(vocab, key=lambda item: item[1]):
        if i in seen:
            raise ValueError(
                f"tokenizer: tokens {seen[i]!r} and {tok!r} both have id {i}; the tokenizers "
                "library decodes such an id to either, so its bytes are unknown"
            )
        seen[i] = tok


def _json_added(entries: Any) -> dict[int, tuple[str, bool, bool]]:
    """A tokenizer.json's ``added_tokens`` as ``id -> (content, special, normalized)``, with
    the tokenizers library's default: ``normalized`` unless special.

    Raises:
        ValueError: the list, an entry or its id is malformed.
    """
    if not isinstance(entries, list):
        raise ValueError(f"tokenizer.json: 'added_tokens' is {entries!r:.60}, not a list")
    added = {}
    for entry in entries:
        if not isinstance(entry, Mapping) or type(entry.get("content")) is not str:
            raise ValueError(
                f"tokenizer.json: the added token {entry!r:.60} is not an object with a "
                "string 'content'"
            )
        special = bool(entry.get("special", False))
        normalized = bool(entry.get("normalized", not special))
        added[_json_id(entry.get("id"), entry["content"])] = (entry["content"], special, normalized)
    return added


class _Added(NamedTuple):
    """An added token as the readers hand it to :func:`_build`."""

    content: str  # its literal, as the tokenizer lists it (BOS and EOS are found by it)
    data: bytes  # what it contributes to the decoded byte stream
    special: bool


def _added_tokens(
    added: Mapping[int, tuple[str, bool, bool]],
    model_tokens: Mapping[int, str],
    scheme: _Scheme,
    normalizer: Callable[[], Callable[[str], str] | None],
) -> dict[int, _Added]:
    """Added tokens ``id -> (content, special, normalized)`` with the bytes each stands for.

    - One that re-declares a model piece (its id holds that very string in the model: Llama 3
      given "ĠĠ" again, the whitespace pieces "▁▁" that transformers' SentencePiece
      conversion lists as added tokens) keeps the piece's bytes: the decoder reads it as
      that piece, so ``ĠĠ`` is b"  ", never the text "ĠĠ".
    - A special one holds its literal, for display only: it is never text.
    - A non-special one matched on the raw input (``normalized=False``) has the bytes the
      tokenizer's decoder gives it, which reads it as it reads a model token: on Llama 2
      ``a▁b`` is b"a b"; on a byte-level tokenizer ``Ġx`` is b" x", while one holding a
      character outside the byte alphabet (a space: ``Ġa b``) is its UTF-8, whole.
    - A non-special one flagged ``normalized`` (``add_tokens``' default) is matched on the
      normalizer's output, and stands for that text: under Llama 2's normalizer
      (``Prepend("▁")``, ``Replace(" ", "▁")``) ``zzqq`` is ``▁zzqq``, so b" zzqq", as a
      word-initial model token is (the decoder gives b"zzqq", which does not round-trip).

    ``normalizer`` makes the normalizer (None: the tokenizer has none); it is called only
    when such a token exists.
    """
    normalize: Callable[[str], str] | None = None  # made for the first such token
    redeclared = [i for i, (content, _, _) in added.items() if model_tokens.get(i) == content]
    model_bytes = dict(zip(redeclared, scheme.to_bytes([model_tokens[i] for i in redeclared])))
    tokens = {}
    for i, (content, special, normalized) in added.items():
        if i in model_bytes:
            data = model_bytes[i]
        elif special:
            data = content.encode("utf-8")
        elif not normalized:
            data = scheme.to_bytes([content])[0]
        else:
            if normalize is None:
                normalize = normalizer() or (lambda text: text)
            text = normalize(content)
            if scheme.kind == "sentencepiece":
                text = text.replace(scheme.space, " ")
            data = text.encode("utf-8")
        tokens[i] = _Added(content, data, special)
    return tokens


def _json_normalizer(node: Any) -> Callable[[str], str] | None:
    """A tokenizer.json ``normalizer`` as a function, for the json-only reader: the
    components Llama-style tokenizers use (``Sequence``, ``Prepend``, ``Replace`` of a
    string) and Unicode normal forms and ``Lowercase``.

    Raises:
        ValueError: another component (a regex ``Replace``, ``Precompiled``...); the
            tokenizers library reads it (:meth:`Vocabulary.from_tokenizer`).
    """
    if node is None:
        return None
    steps: list[Callable[[str], str]] = []
    for c in _components(node):
        kind = c.get("type")
        pattern = (c.get("pattern") or {}).get("String")
        if kind == "Sequence":
            continue
        if kind == "Prepend":
            steps.append(lambda text, prefix=c["prepend"]: prefix + text if text else text)
        elif kind == "Replace" and pattern is not None:
            steps.append(lambda text, old=pattern, new=c["content"]: text.replace(old, new))
        elif kind in ("NFC", "NFD", "NFKC", "NFKD"):
            steps.append(lambda text, form=kind: unicodedata.normalize(form, text))
        elif kind == "Lowercase":
            steps.append(str.lower)
        else:
            raise ValueError(
                f"tokenizer.json: an added token is matched on normalized text, and its "
                f"normalizer {kind!r} is not one the json reader applies; read the tokenizer "
                "with the tokenizers library instead (Vocabulary.from_tokenizer)"
            )

    def normalize(text: str) -> str:
        for step in steps:
            text = step(text)
        return text

    return normalize


def _build(
    model_tokens: Mapping[int, str],
    added: Mapping[int, _Added],
    scheme: _Scheme,
    size: int | None,
    *,
    extra_special: Iterable[int] = (),
    bos: int | None = None,
    eos: Iterable[int] = (),
) -> Vocabulary:
    """Build a Vocabulary from model tokens, added tokens (see :func:`_added_tokens`) and
    the scheme spelling the model tokens; an added token's bytes replace its id's.

    A ``size`` below the tokenizer's ids is a model whose embeddings stop before tokens
    added to its tokenizer (GPT-2 given a pad token, Gemma 3): the model can neither read
    nor predict them, so they are left out, with a warning. One short of the model's own
    tokens is another model's tokenizer: a ``ValueError``.
    """
    ids = [*model_tokens, *added]
    n = max(ids) + 1 if ids else 0
    if size is None:
        size = n
    elif size < n:
        if max(model_tokens, default=-1) >= size:
            raise ValueError(
                f"size={size} is smaller than the tokenizer's {n} token ids, its own tokens "
                "beyond it (not only added ones): is it this model's tokenizer?"
            )
        past = sorted(i for i in added if i >= size)
        logger.warning(
            "the model has %d logits; the tokenizer's added tokens %s past them are left out "
            "(the model can neither read nor predict them)",
            size,
            [added[i].content for i in past][:8],
        )
        added = {i: token for i, token in added.items() if i < size}
        extra_special = [i for i in extra_special if i < size]
        bos = None if bos is not None and bos >= size else bos
        eos = [i for i in eos if i is None or i < size]
    tokens = [b""] * size
    assigned = np.zeros(size, dtype=bool)
    model_ids = list(model_tokens)
    for i, b in zip(model_ids, scheme.to_bytes(list(model_tokens.values()))):
        tokens[i] = b
    assigned[model_ids] = True
    special = set(extra_special)
    for i, token in added.items():
        tokens[i] = token.data
        assigned[i] = True
        if token.special:
            special.add(i)
    unused = frozenset(np.flatnonzero(~assigned).tolist())
    return Vocabulary(
        tokens=tuple(tokens),
        special_ids=frozenset(special) - unused,
        unused_ids=unused,
        bos_token_id=bos,
        eos_token_ids=tuple(e for e in eos if e is not None),
    )


def _template_bos(post_processor: Any) -> str | None:
    """The special token a TemplateProcessing post-processor puts first, if any (the BOS)."""
    for c in _components(post_processor):
        if c.get("type") == "TemplateProcessing":
            first = (c.get("single") or [None])[0]
            if isinstance(first, dict) and "SpecialToken" in first:
                return first["SpecialToken"]["id"]
    return None


def _token_name(value: Any) -> str | None:
    """A token named in tokenizer_config.json: a string or a serialized AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _is_transformers(tokenizer: Any) -> bool:
    return any(c.__module__.startswith("transformers.") for c in type(tokenizer).__mro__)


def _from_tokenizers_backend(
    tokenizer: Any,
) -> tuple[dict[int, str], dict[int, _Added], dict, _Scheme]:
    """Read a ``tokenizers.Tokenizer`` through its getters (``to_str`` is ~1 s on Llama 3):
    model tokens, added tokens (:func:`_added_tokens`), its components' spec, its scheme."""
    vocab = tokenizer.get_vocab(with_added_tokens=False)
    model_tokens = {i: tok for tok, i in vocab.items()}
    if len(model_tokens) < len(vocab):
        _refuse_shared_ids(vocab.items())

    def state(component: Any) -> Any:
        return None if component is None else json.loads(component.__getstate__())

    spec = {
        "decoder": state(tokenizer.decoder),
        "pre_tokenizer": state(tokenizer.pre_tokenizer),
        "normalizer": state(tokenizer.normalizer),
        "post_processor": state(tokenizer.post_processor),
        "model": {"byte_fallback": _byte_fallback(tokenizer.model)},
    }
    scheme = _scheme_from_spec(spec)
    added = _added_tokens(
        {
            int(i): (t.content, bool(t.special), bool(t.normalized))
            for i, t in tokenizer.get_added_tokens_decoder().items()
        },
        model_tokens,
        scheme,
        lambda: None if tokenizer.normalizer is None else tokenizer.normalizer.normalize_str,
    )
    return model_tokens, added, spec, scheme


def _byte_fallback(model: Any) -> bool:
    """Whether a ``tokenizers`` model spells unknown characters as ``<0xNN>`` byte pieces.

    BPE has the attribute; Unigram has none, but keeps the flag in its state, as
    tokenizer.json does (a ByteFallback step in the decoder is not required: the pieces
    stand for those bytes either way, as the json reader reads them).
    """
    flag = getattr(model, "byte_fallback", None)
    if flag is None:
        try:
            flag = json.loads(model.__getstate__()).get("byte_fallback")
        except (AttributeError, TypeError, ValueError):  # a model with no such state
            flag = False
    return bool(flag)


def _from_tiktoken(encoding: Any, size: int | None) -> Vocabulary:
    """Read a tiktoken ``Encoding``: its mergeable ranks are already bytes."""
    specials: dict[str, int] = dict(getattr(encoding, "_special_tokens", None) or {})
    ranks: dict[bytes, int] | None = getattr(encoding, "_mergeable_ranks", None)
    n = encoding.n_vocab
    if size is not None and size < n:
        raise ValueError(f"size={size} is smaller than the tokenizer's {n} token ids")
    size = n if size is None else size
    tokens = [b""] * size
    assigned = np.zeros(size, dtype=bool)
    if ranks is not None:
        for tok, i in ranks.items():
            tokens[i] = tok
            assigned[i] = True
    else:  # no private table: ask id by id, holes raise KeyError
        special_values = set(specials.values())
        for i in range(n):
            if i in special_values:
                continue
            try:
                tokens[i] = encoding.decode_single_token_bytes(i)
                assigned[i] = True
            except KeyError:
                pass
    for text, i in specials.items():
        tokens[i] = text.encode("utf-8")
        assigned[i] = True
    eos = [specials[t] for t in ("<|endoftext|>", "<|end_of_text|>") if t in specials]
    unused = frozenset(np.flatnonzero(~assigned).tolist())
    return Vocabulary(
        tokens=tuple(tokens),
        special_ids=frozenset(specials.values()),
        unused_ids=unused,
        bos_token_id=specials.get("<|begin_of_text|>"),
        eos_token_ids=tuple(eos[:1]),
    )


def _from_transformers(tokenizer: Any, size: int | None) -> Vocabulary:
    """Read a transformers tokenizer, fast (tokenizers backend) or slow (Python / SentencePiece)."""
    # A special token the tokenizer does not hold (``pad_token = "[PAD]"`` on a tokenizer
    # with no unk token) is listed with the id None.
    listed = getattr(tokenizer, "all_special_ids", ()) or ()
    special = {int(i) for i in listed if i is not None}
    bos = tokenizer.bos_token_id
    eos = [tokenizer.eos_token_id]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        model_tokens, added, _, scheme = _from_tokenizers_backend(backend)
        # transformers lists its extra special tokens in all_special_ids even where the
        # backend flags them special=False (the whitespace pieces of a SentencePiece
        # conversion); decode(skip_special_tokens=True) follows the backend's flag.
        special -= {i for i, token in added.items() if not token.special}
    else:
        declared = {
            int(i): t for i, t in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items()
        }
        n = max([len(tokenizer), *(i + 1 for i in declared)])
        pieces = tokenizer.convert_ids_to_tokens(list(range(n)))
        model_tokens = {i: p for i, p in enumerate(pieces) if p is not None and i not in declared}
        sp_model = getattr(tokenizer, "sp_model", None)
        if any(type(p) is bytes for p in model_tokens.values()):
            scheme = _Scheme("plain")  # pieces named by their bytes
        elif getattr(tokenizer, "byte_decoder", None) is not None:
            scheme = _Scheme("byte_level")
        elif sp_model is not None:
            scheme = _Scheme("sentencepiece", _SPIECE_SPACE, True)
            for i in model_tokens:
                if i < sp_model.get_piece_size() and (
                    sp_model.is_control(i) or sp_model.is_unknown(i)
                ):
                    special.add(i)
        else:
            scheme = _guess_scheme(model_tokens.values())
        # A slow tokenizer matches every added token on the raw text (it has no normalizer)
        # and decodes it as it decodes a piece.
        added = _added_tokens(
            {i: (t.content, bool(t.special), False) for i, t in declared.items()},
            model_tokens,
            scheme,
            lambda: None,
        )
        # convert_ids_to_tokens returns the unk token for ids it does not know: those are holes.
        unk = getattr(tokenizer, "unk_token_id", None)
        if unk is not None:
            model_tokens = {
                i: p for i, p in model_tokens.items() if i == unk or p != tokenizer.unk_token
            }
    return _build(model_tokens, added, scheme, size, extra_special=special, bos=bos, eos=eos)


def _token_id(value: object, what: str) -> int:
    """``value`` as a token id: a Python or numpy integer, not a bool (``int()`` read 1.7
    as 1, ``"1"`` as 1 and True as 1).

    Raises:
        TypeError: it is not an integer; the message starts with ``what``.
    """
    # numpy 2's bools have no __index__; numpy 1's do (deprecated), so both are refused here.
    if value is True or value is False or isinstance(value, np.bool_):
        raise TypeError(f"{what}: {value!r} is a bool, not an integer token id")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(
            f"{what}: {value!r} ({type(value).__name__}) is not an integer token id"
        ) from None


def _vocab_size(size: object) -> int | None:
    """``size=`` as a non-negative integer or None (a float broke list repetition with an
    unrelated message, and True was read as 1).

    Raises:
        TypeError: it is not an integer.
        ValueError: it is negative.
    """
    if size is None:
        return None
    if size is True or size is False or isinstance(size, np.bool_):
        raise TypeError(f"size: {size!r} is a bool, not an integer vocabulary size")
    try:
        n = operator.index(size)
    except TypeError:
        raise TypeError(
            f"size: {size!r} ({type(size).__name__}) is not an integer vocabulary size"
        ) from None
    if n < 0:
        raise ValueError(f"size={n} is negative")
    return n


def _token_ids(ids: Iterable[int], what: str) -> list[int]:
    """A collection of token ids as ints (:func:`_token_id`); a bare id or a string is not one."""
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise TypeError(f"{what} must be a collection of token ids, got {ids!r:.60}")
    return [i if i.__class__ is int else _token_id(i, what) for i in ids]


@attrs.frozen
class Vocabulary:
    """The byte string of every token id of a model.

    ``tokens[i]`` is exactly what token ``i`` contributes to the decoded byte stream: byte-level
    BPE (GPT-2, Llama 3, tiktoken) maps each character back through GPT-2's byte-to-unicode
    table; SentencePiece-style BPE (Llama 2, stories260K) turns ``▁`` into b" " and
    ``<0xNN>`` into the single byte 0xNN. Token identity is the id: two ids may hold equal bytes
    (e.g. SentencePiece ``▁`` and ``<0x20>`` are both b" ").

    The byte-exact property, for ``ids = tokenizer.encode(s, add_special_tokens=False)`` where
    ``s`` contains no added token's literal (the next paragraph says which may appear):
    ``vocab.decode(ids) == s.encode("utf-8")`` for byte-level tokenizers. SentencePiece-style
    tokenizers read a literal ``▁`` (U+2581) in the text as a space ("a▁b" and "a b" get the
    same ids), so their ids join to ``t = s.replace("▁", " ").encode("utf-8")``, after a b" "
    where they add a dummy prefix: the ``Prepend("▁")`` normalizer of Llama 2 and stories260K
    always adds one (``b" " + t``: " a" joins to b"  a"), a Metaspace pre-tokenizer with a
    prepend scheme (``"first"``, ``"always"``) only where ``t`` does not already start with b" "
    (" a" and "a" both join to b" a"), and ``"never"`` none. The empty string encodes to no ids
    at all. The leading b" " is real: it is the first token's ``▁``, which ``tokenizer.decode``
    strips afterwards. WordPiece (``##``) vocabularies are not byte-exact and come out as their
    raw token text, as do BPE vocabularies whose decoder turns a ``</w>`` suffix into a space
    (OpenAI GPT, CLIP); reading one through its decoder logs a warning.

    With literals of non-special added tokens in ``s``, the property holds exactly where two
    things do. Each such token's bytes are its literal's UTF-8 (``▁`` read as b" " on
    SentencePiece-style tokenizers): true of a normalized one that is no model piece (see
    below) and of a raw-matched one (``normalized=False``) holding no other byte-level
    character or byte piece (``<tab>``, ``a▁b`` on Llama 2), false of ``Ġx`` added raw to
    GPT-2 (b" x"), of ``<0x42>`` added raw to a byte-fallback model (b"B") and of one that
    re-declares a model piece (the text "ĠĠ", matched by Llama 3's "ĠĠ" added again, joins
    to b"  "); where this fails, the tokenizer's own ``decode`` does not give ``s`` back
    either. And no dummy prefix moves: a raw-matched literal is cut out before normalizing,
    so under the ``Prepend`` normalizer the text after it gets a dummy b" " of its own and a
    text starting with it none; a Metaspace pre-tokenizer sees only the text between added
    literals, so under ``"first"`` a text starting with one gets no dummy b" " and under
    ``"always"`` each stretch after one gets its own.

    ``special_ids`` are added tokens flagged special (plus control/unknown pieces of slow
    SentencePiece tokenizers). They are never ordinary text: the tokenizer emits them only when
    it matches their literal in the input or adds them itself, so ``tokens[i]`` holds their
    literal only for display and ``decode`` skips them by default. The flag is the tokenizer's
    own: transformers' ``all_special_ids`` also lists non-special added tokens it was given as
    extra special tokens (the whitespace pieces of a SentencePiece conversion, Gemma's
    ``▁▁``), and those are text here, as ``decode(..., skip_special_tokens=True)`` keeps them.

    Added tokens that are not flagged special are ordinary text. One matched on the raw text
    (``normalized=False``) has the bytes the tokenizer's decoder gives it, which reads its
    ``▁``, ``Ġ`` or ``<0xNN>`` as in a model token: ``a▁b`` added to Llama 2 is b"a b",
    ``Ġx`` added to GPT-2 b" x", while ``<tab>``, or one holding a character outside the
    byte-level alphabet, is its UTF-8. One flagged ``normalized`` (matched on the normalizer's
    output, as ``add_tokens`` does by default) stands for its normalized content spelled as
    text: ``zzqq`` added to Llama 2 is b" zzqq", like a word-initial model token (the decoder
    writes b"zzqq", which would not round-trip). One that re-declares a model piece (the
    piece's own string at its id: Llama 3 given "ĠĠ" again, the whitespace pieces a
    SentencePiece conversion lists as added tokens) keeps the piece's bytes, b"  " for
    ``ĠĠ`` and ``▁▁``, as the decoder reads it. ``unused_ids`` are holes in the id space and
    padding rows of a model whose logits are wider than the tokenizer; their bytes are b"".

    Attributes:
        tokens: the bytes of each token id.
        special_ids: ids of special tokens (never ordinary text).
        unused_ids: ids that are holes or padding rows; their bytes are b"".
        bos_token_id: the beginning-of-sequence id, if the tokenizer has one.
        eos_token_ids: the end-of-sequence ids (possibly several, possibly none).

    Token ids, here and in every method, are Python or numpy integers; a float, a bool or a
    string is a ``TypeError`` naming the argument (``int()`` would read 1.7 as 1).

    Raises:
        ValueError: a named id is out of range, both special and unused, or an unused id
            has bytes.
        TypeError: a token is not ``bytes``; a named id is not an integer, or a collection
            of ids is a bare id.
    """

    tokens: tuple[bytes, ...] = attrs.field(converter=tuple)
    special_ids: frozenset[int] = attrs.field(
        default=frozenset(), converter=lambda ids: frozenset(_token_ids(ids, "special_ids"))
    )
    unused_ids: frozenset[int] = attrs.field(
        default=frozenset(), converter=lambda ids: frozenset(_token_ids(ids, "unused_ids"))
    )
    bos_token_id: int | None = attrs.field(
        default=None, converter=lambda i: None if i is None else _token_id(i, "bos_token_id")
    )
    eos_token_ids: tuple[int, ...] = attrs.field(
        default=(), converter=lambda ids: tuple(_token_ids(ids, "eos_token_ids"))
    )

    def __attrs_post_init__(self) -> None:
        # Validate once here so every consumer can trust ids and bytes without rechecking.
        n = len(self.tokens)
        named = [*self.special_ids, *self.unused_ids, *self.eos_token_ids]
        if self.bos_token_id is not None:
            named.append(self.bos_token_id)
        bad = [i for i in named if not 0 <= i < n]
        if bad:
            raise ValueError(f"token id {bad[0]} is out of range for a vocabulary of {n} tokens")
        both = self.special_ids & self.unused_ids
        if both:
            raise ValueError(f"token id {min(both)} is both special and unused")
        filled = [i for i in self.unused_ids if self.tokens[i]]
        if filled:
            raise ValueError(
                f"unused token id {min(filled)} has bytes {self.tokens[min(filled)]!r}; "
                "unused ids hold b''"
            )
        if not set(map(type, self.tokens)) <= {bytes}:
            i = next(i for i, t in enumerate(self.tokens) if type(t) is not bytes)
            raise TypeError(f"token id {i} is {type(self.tokens[i]).__name__}, not bytes")

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> bytes:
        i = _token_id(i, "Vocabulary index")
        if not 0 <= i < len(self.tokens):
            raise IndexError(
                f"token id {i} is out of range for a vocabulary of {len(self.tokens)} tokens"
            )
        return self.tokens[i]

    def is_special(self, i: int) -> bool:
        """Whether token ``i`` is special (never ordinary text); False for ids out of range.

        Raises:
            TypeError: ``i`` is not an integer (a float, a bool, a string).
        """
        return _token_id(i, "is_special") in self.special_ids

    @property
    def byte_vocab(self) -> list[bytes]:
        """The bytes of every id as a list, the shape most trie builders take."""
        return list(self.tokens)

    @property
    def text_ids(self) -> np.ndarray:
        """Sorted ids of ordinary tokens, the only ones a byte-level constraint can reach."""
        mask = np.ones(len(self.tokens), dtype=bool)
        excluded = [*self.special_ids, *self.unused_ids]
        if excluded:
            mask[np.fromiter(excluded, dtype=np.int64, count=len(excluded))] = False
        return np.flatnonzero(mask)

    def with_model_eos(self, eos_token_id: Any) -> Vocabulary:
        """This vocabulary with the model's own EOS ids added after its own (each once).

        ``eos_token_id`` is what a model's generation configuration says (transformers'
        ``generation_config.eos_token_id``: an id, a list of ids or None), the ids
        ``generate`` stops on. It may be wider than the tokenizer's EOS: Llama 3 Instruct's
        tokenizer names ``<|eot_id|>``, its generation configuration also
        ``<|end_of_text|>`` and ``<|eom_id|>``. Backends read it when they load a model, so
        that ``sample`` and byte-level models end where the model's own generation does.
        A configuration's id that is not a token id of this vocabulary (out of range, not
        an integer) is left out with a warning: a stale configuration must not stop a model
        from loading.
        """
        if eos_token_id is None:
            return self
        if isinstance(eos_token_id, (int, np.integer)):
            eos_token_id = [eos_token_id]
        if isinstance(eos_token_id, (str, bytes)) or not isinstance(eos_token_id, Iterable):
            logger.warning("ignored the model's eos_token_id %r: not token ids", eos_token_id)
            return self
        added = []
        for i in eos_token_id:
            ok = isinstance(i, (int, np.integer)) and not isinstance(i, bool)
            if not ok or not 0 <= i < len(self.tokens):
                logger.warning(
                    "ignored the model's EOS id %r: not a token id of this %d-token vocabulary",
                    i,
                    len(self.tokens),
                )
            elif int(i) not in self.eos_token_ids and int(i) not in added:
                added.append(int(i))
        return attrs.evolve(self, eos_token_ids=(*self.eos_token_ids, *added)) if added else self

    def decode(self, ids: Iterable[int], *, keep_special: bool = False) -> bytes:
        """The bytes of ``ids`` joined (maybe not UTF-8), specials only if ``keep_special``.

        Raises:
            TypeError: ``ids`` is text or bytes (its characters are no ids), or holds an id
                that is not an integer (a float, a bool).
            ValueError: an id is outside the vocabulary.
        """
        if isinstance(ids, (str, bytes, bytearray, memoryview)):  # no ids in characters
            raise TypeError(f"decode takes token ids, not {type(ids).__name__} {ids!r:.60}")
        if isinstance(ids, np.ndarray):
            # An integer array as Python ints at once; any other (an empty float array,
            # objects) is read id by id below, each checked.
            ids = ids.tolist() if ids.dtype.kind in "iu" else list(ids)
        tokens, special, n = self.tokens, self.special_ids, len(self.tokens)
        out = []
        for i in ids:
            if i.__class__ is not int:  # numpy integers pass _token_id
                i = _token_id(i, "decode")
            if not 0 <= i < n:
                raise ValueError(f"token id {i} is out of range for a vocabulary of {n} tokens")
            if keep_special or i not in special:
                out.append(tokens[i])
        return b"".join(out)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, size: int | None = None) -> Vocabulary:
        """Read a transformers tokenizer, a ``tokenizers.Tokenizer`` or a tiktoken ``Encoding``.

        ``size``: the model's logit width when it is wider than the tokenizer (the ids from
        the tokenizer's size up to it are unused).

        Raises:
            TypeError: ``tokenizer`` is none of those, or ``size`` is not an integer.
            ValueError: ``size`` is negative or smaller than the tokenizer.
        """
        size = _vocab_size(size)
        module = type(tokenizer).__module__
        if module.startswith("tiktoken") or hasattr(tokenizer, "decode_single_token_bytes"):
            return _from_tiktoken(tokenizer, size)
        if _is_transformers(tokenizer):
            return _from_transformers(tokenizer, size)
        if module.startswith("tokenizers") or hasattr(tokenizer, "get_added_tokens_decoder"):
            model_tokens, added, spec, scheme = _from_tokenizers_backend(tokenizer)
            bos_name = _template_bos(spec["post_processor"])
            bos = next((i for i, token in added.items() if token.content == bos_name), None)
            return _build(model_tokens, added, scheme, size, bos=bos)
        raise TypeError(
            f"cannot read a vocabulary from {type(tokenizer).__qualname__} ({module}); "
            "expected a transformers tokenizer, a tokenizers.Tokenizer or a tiktoken Encoding"
        )

    @classmethod
    def from_tokenizer_json(cls, path: str | Path, size: int | None = None) -> Vocabulary:
        """Read a tokenizer.json (or a directory holding one) with the json module alone.

        BOS and EOS come from tokenizer_config.json or special_tokens_map.json beside it; without
        them BOS is the special token the post-processor template puts first and EOS is unknown.
        ``size`` is as for :meth:`from_tokenizer`.

        Raises:
            ValueError: the file is malformed (not a JSON object, a token id that is not a
                non-negative integer, an added token without a string ``content``...), or
                ``size`` is negative or smaller than the tokenizer.
            TypeError: ``size`` is not an integer.
        """
        path = Path(path)
        directory, file = (path, path / "tokenizer.json") if path.is_dir() else (path.parent, path)
        size = _vocab_size(size)
        spec = json.loads(file.read_text(encoding="utf-8"))
        if not isinstance(spec, dict):
            raise ValueError(f"{file} holds {spec!r:.60}, not a tokenizer.json object")
        try:
            return cls._from_json_spec(spec, directory, size)
        except (AttributeError, KeyError, TypeError) as exc:  # a component missing a field
            raise ValueError(
                f"{file} (or a config file beside it) is malformed: {type(exc).__name__}: {exc}"
            ) from exc

    @staticmethod
    def _from_json_spec(spec: dict, directory: Path, size: int | None) -> Vocabulary:
        """:meth:`from_tokenizer_json`'s reading of a parsed tokenizer.json ``spec``."""
        model_tokens = _model_vocab(spec.get("model") or {})
        scheme = _scheme_from_spec(spec)
        added = _added_tokens(
            _json_added(spec.get("added_tokens") or []),
            model_tokens,
            scheme,
            lambda: _json_normalizer(spec.get("normalizer")),
        )
        if not model_tokens and not added:
            raise ValueError("tokenizer.json: no tokens at all (its model has no vocab)")
        names: dict[str, Any] = {}
        for name in (
            "special_tokens_map.json",
            "tokenizer_config.json",
        ):  # the later file wins
            if (directory / name).is_file():
                names.update(json.loads((directory / name).read_text(encoding="utf-8")))
        ids = {tok: i for i, tok in model_tokens.items()}
        ids |= {token.content: i for i, token in added.items()}
        bos_name = (
            _token_name(names.get("bos_token"))
            if "bos_token" in names
            else _template_bos(spec.get("post_processor"))
        )
        eos_name = _token_name(names.get("eos_token"))
        return _build(
            model_tokens,
            added,
            scheme,
            size,
            bos=ids.get(bos_name) if bos_name else None,
            eos=[ids.get(eos_name)] if eos_name else [],
        )
