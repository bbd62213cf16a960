"""Byte vocabularies read from real tokenizers agree byte for byte with what they encode."""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from support.imports import modules_loaded_by

from genlm.core._vocab import Vocabulary

FIXTURES = Path(__file__).parent.parent / "fixtures"
REPO = Path(__file__).resolve().parent.parent.parent
# Meta-licensed tokenizers are never committed: they are read from the shared models folder
# beside the checkout (a worktree elsewhere can point at it with GENLM_SHARED_MODELS).
SHARED = Path(os.environ.get("GENLM_SHARED_MODELS", REPO.parent / "shared" / "models"))

# Which tokenizers add a dummy-prefix "▁" (Prepend normalizer), so that encoding a non-empty
# string s yields tokens whose bytes join to b" " + s rather than s.
DUMMY_PREFIX = {"stories260K": True, "gpt2": False, "llama2": True, "llama3.2": False}
NAMES = list(DUMMY_PREFIX)


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES


def tokenizer_dir(name: str) -> Path:
    """Committed fixture for MIT tokenizers, shared folder for Meta ones; skip when absent."""
    if name in ("stories260K", "gpt2"):
        return FIXTURES / "tokenizers" / name
    path = SHARED / "tokenizers" / name
    if not (path / "tokenizer.json").is_file():
        pytest.skip(f"{name} is not committed (Meta licence) and {path} does not exist")
    return path


@functools.cache
def hf_tokenizer(name: str):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir(name)))


@functools.cache
def vocab_from_tokenizer(name: str) -> Vocabulary:
    return Vocabulary.from_tokenizer(hf_tokenizer(name))


@functools.cache
def vocab_from_json(name: str) -> Vocabulary:
    return Vocabulary.from_tokenizer_json(tokenizer_dir(name))


@functools.cache
def special_literals(name: str) -> tuple[str, ...]:
    spec = json.loads((tokenizer_dir(name) / "tokenizer.json").read_text(encoding="utf-8"))
    return tuple(t["content"] for t in spec["added_tokens"])


@functools.cache
def metaspace_tokenizer(scheme: str):
    """stories260K's tokenizer as newer Hugging Face conversions write SentencePiece ones: no
    normalizer, a Metaspace pre-tokenizer and decoder with ``prepend_scheme=scheme``; with
    its Vocabulary."""
    tokenizers = pytest.importorskip("tokenizers")
    spec = json.loads((tokenizer_dir("stories260K") / "tokenizer.json").read_text("utf-8"))
    metaspace = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": scheme}
    spec["normalizer"] = None
    spec["pre_tokenizer"] = {**metaspace, "split": False}
    spec["decoder"] = {
        "type": "Sequence",
        "decoders": [{"type": "ByteFallback"}, {**metaspace, "split": False}],
    }
    tok = tokenizers.Tokenizer.from_str(json.dumps(spec))
    return tok, Vocabulary.from_tokenizer(tok)


def gpt2_bytes_to_unicode() -> dict[int, str]:
    """openai/gpt-2 encoder.py's byte map, written out here independently of the module."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    others = [b for b in range(256) if b not in printable]
    mapping = {b: chr(b) for b in printable}
    mapping.update({b: chr(256 + k) for k, b in enumerate(others)})
    return mapping


GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@functools.cache
def gpt2_tiktoken():
    """A tiktoken Encoding for GPT-2 built offline from vocab.json (GPT-2 ranks are its ids)."""
    tiktoken = pytest.importorskip("tiktoken")
    decode_char = {c: b for b, c in gpt2_bytes_to_unicode().items()}
    encoder = json.loads(
        (FIXTURES / "tokenizers" / "gpt2" / "vocab.json").read_text(encoding="utf-8")
    )
    ranks = {
        bytes(decode_char[c] for c in tok): i
        for tok, i in encoder.items()
        if tok != "<|endoftext|>"
    }
    return tiktoken.Encoding(
        "gpt2-local",
        pat_str=GPT2_PAT,
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": 50256},
        explicit_n_vocab=50257,
    )


pieces = st.one_of(
    st.text("abcXYZ019 .,;:'\"!?-_()[]{}<>/\\|@#$%^&*+=~`", max_size=20),
    st.text(st.sampled_from(" \t\n\r\x0b\x0c\u00a0\u2009\u3000"), min_size=1, max_size=8),
    st.text(
        st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF),
        min_size=1,
        max_size=6,
    ),
    st.text(st.characters(categories=["Mn", "Me"]), min_size=1, max_size=3),
    st.text(st.characters(categories=["Cc"]), min_size=1, max_size=3),
    st.sampled_from(
        ["🙂", "👍🏽", "👨\u200d👩\u200d👧", "🇫🇷", "❤️", "𝔘𝔫𝔦", "e\u0301", "naïve café"]
    ),
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12),
)
texts = st.lists(pieces, max_size=8).map("".join)
property_settings = settings(
    max_examples=int(os.environ.get("GENLM_HYPOTHESIS_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def slow_sentencepiece(transformers):
    """stories260K's tokenizer as a slow SentencePiece-backed transformers tokenizer (its
    ``tok512.model``), or a skip where that file or sentencepiece is missing."""
    backend = getattr(transformers, "SentencePieceBackend", None) or transformers.LlamaTokenizer
    model = SHARED / "stories260K" / "llama2c" / "tok512.model"
    if not model.is_file():
        pytest.skip(f"{model} does not exist")
    pytest.importorskip("sentencepiece")
    return backend(vocab_file=str(model), bos_token="<s>", eos_token="</s>", unk_token="<unk>")


class TestRealTokenizers:
    @pytest.mark.parametrize("name", NAMES)
    def test_tokenizer_and_json_agree(self, name):
        """from_tokenizer, from_tokenizer_json and a raw tokenizers.Tokenizer agree exactly."""
        tokenizers = pytest.importorskip("tokenizers")
        a, b = vocab_from_tokenizer(name), vocab_from_json(name)
        raw = Vocabulary.from_tokenizer(
            tokenizers.Tokenizer.from_file(str(tokenizer_dir(name) / "tokenizer.json"))
        )
        assert len(a) == len(hf_tokenizer(name))
        assert a.tokens == b.tokens == raw.tokens
        assert a.special_ids == b.special_ids == raw.special_ids
        assert a.unused_ids == b.unused_ids == raw.unused_ids == frozenset()
        assert (a.bos_token_id, a.eos_token_ids) == (b.bos_token_id, b.eos_token_ids)
        assert (a.bos_token_id, a.eos_token_ids) == (
            hf_tokenizer(name).bos_token_id,
            (hf_tokenizer(name).eos_token_id,),
        )
        assert raw.bos_token_id == (
            a.bos_token_id if DUMMY_PREFIX[name] or name == "llama3.2" else None
        )

    @pytest.mark.parametrize("name", NAMES)
    @property_settings
    @given(s=texts)
    def test_encoded_ids_join_to_the_text(self, name, s):
        """The ids of any text join to its UTF-8 (after b" " for dummy-prefix tokenizers)."""
        assume(not any(lit in s for lit in special_literals(name)))
        ids = hf_tokenizer(name).encode(s, add_special_tokens=False)
        if DUMMY_PREFIX[name]:
            # SentencePiece normalizes " " to "▁", so a literal "▁" in the text is a space too.
            expected = (b" " if s else b"") + s.replace("\u2581", " ").encode("utf-8")
        else:
            expected = s.encode("utf-8")
        for vocab in (vocab_from_tokenizer(name), vocab_from_json(name)):
            assert b"".join(vocab[i] for i in ids) == expected
            assert vocab.decode(ids) == expected
            assert not any(vocab.is_special(i) for i in ids)

    def test_gpt2_known_ids(self):
        """GPT-2 ids decode to their well-known bytes, the Ġ of byte-level BPE becoming a space."""
        vocab = vocab_from_json("gpt2")
        assert (vocab[15496], vocab[995], vocab[43453]) == (
            b"Hello",
            b" world",
            b" SolidGoldMagikarp",
        )
        # Ids 0-255 are single bytes in byte-to-unicode order: printable ones first, then the
        # rest spelled with characters from U+0100 (0x00 is Ā, \n is Ċ, 0xad is Ń).
        assert (vocab[187], vocab[188], vocab[198], vocab[255]) == (
            b"\xff",
            b"\x00",
            b"\n",
            b"\xad",
        )
        # 🙂 is split across tokens that are not valid UTF-8 on their own.
        ids = [2616, 38776, 40304, 10545, 251, 109, 12859, 105, 32485]
        assert vocab.decode(ids) == "naïve café 東京 🙂".encode()
        partial = [i for i in ids if vocab[i].decode("utf-8", errors="ignore").encode() != vocab[i]]
        assert partial, "some GPT-2 ids hold a fragment of a multi-byte character"

    def test_sentencepiece_byte_fallback(self):
        """stories260K's <0xNN> pieces are single raw bytes and its ▁ is a space byte."""
        vocab = vocab_from_json("stories260K")
        assert [vocab[3 + b] for b in range(256)] == [bytes([b]) for b in range(256)]
        ids = [
            297,
            412,
            198,
            178,
            360,
            280,
            412,
            431,
            485,
            410,
            233,
            160,
            180,
            231,
            189,
            175,
            410,
            243,
            162,
            156,
            133,
        ]
        assert vocab.decode(ids) == " naïve café 東京 🙂".encode()
        tok = hf_tokenizer("stories260K")
        assert tok.decode(ids) == "naïve café 東京 🙂"  # the HF decoder strips the dummy prefix

    def test_dummy_prefix_is_a_real_token(self):
        """A leading space in stories260K text costs an extra ▁ token: the join gains b" "."""
        tok, vocab = hf_tokenizer("stories260K"), vocab_from_json("stories260K")
        assert vocab.decode(tok.encode("a", add_special_tokens=False)) == b" a"
        assert vocab.decode(tok.encode(" a", add_special_tokens=False)) == b"  a"
        assert tok.encode("", add_special_tokens=False) == []

    @pytest.mark.parametrize("name", ["stories260K", "llama2"])
    def test_literal_metaspace_is_a_space(self, name):
        """SentencePiece tokenizers encode a literal ▁ like a space, so it decodes as b" "."""
        tok, vocab = hf_tokenizer(name), vocab_from_json(name)
        ids = tok.encode("a\u2581b", add_special_tokens=False)
        assert ids == tok.encode("a b", add_special_tokens=False)
        assert vocab.decode(ids) == b" a b" and tok.decode(ids) == "a b"

    @pytest.mark.parametrize("scheme", ["first", "always", "never"])
    @property_settings
    @given(s=texts)
    def test_metaspace_prefix_only_before_a_non_space(self, scheme, s):
        """Under a Metaspace pre-tokenizer with a prepend scheme the dummy b" " comes only
        where the text does not start with a space (" a" joins to b" a", not b"  a" as under
        Llama 2's Prepend normalizer); without one (``never``) the ids join to the text."""
        assume(not any(lit in s for lit in special_literals("stories260K")))
        tok, vocab = metaspace_tokenizer(scheme)
        text = s.replace("\u2581", " ").encode("utf-8")
        prefix = scheme != "never" and text != b"" and not text.startswith(b" ")
        assert vocab.decode(tok.encode(s, add_special_tokens=False).ids) == (
            b" " + text if prefix else text
        )

    def test_duplicate_bytes_keep_distinct_ids(self):
        """SentencePiece ▁ and <0x20> are different ids with the same byte, and both stay text."""
        tok, vocab = hf_tokenizer("stories260K"), vocab_from_json("stories260K")
        space = tok.convert_tokens_to_ids("▁")
        assert space != 3 + 0x20 and vocab[space] == vocab[3 + 0x20] == b" "
        assert {space, 3 + 0x20} <= set(vocab.text_ids.tolist())
        assert len(set(vocab.tokens)) < len(vocab)

    def test_llama3_is_fast(self):
        """Llama 3.2's 128,256 tokens are read in well under the time of a decode call per id."""
        tok = hf_tokenizer("llama3.2")
        start = time.perf_counter()
        vocab = Vocabulary.from_tokenizer(tok)
        assert time.perf_counter() - start < 3.0  # about 0.25 s on 2 cores
        assert len(vocab) == 128256


class TestSpecialTokens:
    def test_gpt2_endoftext_is_special(self):
        """<|endoftext|> is special, skipped by decode and kept as its literal for display."""
        vocab = vocab_from_tokenizer("gpt2")
        assert vocab.special_ids == {50256} and vocab.is_special(50256)
        assert vocab[50256] == b"<|endoftext|>"
        assert 50256 not in vocab.text_ids and len(vocab.text_ids) == 50256
        assert vocab.decode([15496, 50256]) == b"Hello"
        assert vocab.decode([15496, 50256], keep_special=True) == b"Hello<|endoftext|>"

    def test_gpt2_endoftext_literal_as_text(self):
        """The literal <|endoftext|>, encoded as text, is ordinary ids joining to that literal."""
        tok, vocab = hf_tokenizer("gpt2"), vocab_from_tokenizer("gpt2")
        assert tok.encode("<|endoftext|>", add_special_tokens=False) == [50256]
        ids = tok("<|endoftext|>", add_special_tokens=False, split_special_tokens=True)["input_ids"]
        assert len(ids) > 1 and not any(vocab.is_special(i) for i in ids)
        assert vocab.decode(ids) == b"<|endoftext|>"

    def test_llama3_has_256_special_ids(self):
        """Llama 3.2's special ids are exactly 128000-128255, with BOS 128000 and EOS 128001."""
        vocab = vocab_from_json("llama3.2")
        assert vocab.special_ids == frozenset(range(128000, 128256))
        assert vocab.bos_token_id == 128000 and vocab.eos_token_ids == (128001,)
        assert np.array_equal(vocab.text_ids, np.arange(128000))
        assert vocab[128009] == b"<|eot_id|>"

    def test_sentencepiece_control_tokens(self):
        """stories260K's <unk>, <s>, </s> are special, with BOS 1 and EOS 2."""
        vocab = vocab_from_json("stories260K")
        assert vocab.special_ids == {0, 1, 2}
        assert (vocab.bos_token_id, vocab.eos_token_ids) == (1, (2,))
        assert vocab.decode([1, 297, 2]) == vocab[297] and vocab[1] == b"<s>"


class TestTiktoken:
    def test_gpt2_encoding_matches_hf(self):
        """A tiktoken GPT-2 Encoding gives the same vocabulary as the HF GPT-2 tokenizer."""
        vocab = Vocabulary.from_tokenizer(gpt2_tiktoken())
        assert vocab.tokens == vocab_from_json("gpt2").tokens
        assert vocab.special_ids == {50256} and vocab.eos_token_ids == (50256,)

    @property_settings
    @given(s=texts)
    def test_encoded_ids_join_to_the_text(self, s):
        """Bytes of tiktoken ids join to the text, and the ids equal the HF tokenizer's."""
        assume("<|endoftext|>" not in s)
        enc = gpt2_tiktoken()
        ids = enc.encode(s)
        assert Vocabulary.from_tokenizer(enc).decode(ids) == s.encode("utf-8")
        assert ids == hf_tokenizer("gpt2").encode(s, add_special_tokens=False)

    def test_holes_in_the_id_space(self):
        """Ids no rank or special token uses are unused and hold b""."""
        tiktoken = pytest.importorskip("tiktoken")
        ranks = {**{bytes([b]): b for b in range(256)}, b"ab": 300}
        enc = tiktoken.Encoding(
            "gap",
            pat_str=r"\S+|\s+",
            mergeable_ranks=ranks,
            special_tokens={"<|endoftext|>": 310},
        )
        vocab = Vocabulary.from_tokenizer(enc)
        assert len(vocab) == 311
        assert vocab.unused_ids == frozenset(range(256, 300)) | frozenset(range(301, 310))
        assert all(vocab[i] == b"" for i in vocab.unused_ids)
        assert vocab.special_ids == {310} and vocab[300] == b"ab"
        assert vocab.decode(enc.encode("abc ab")) == b"abc ab"
        assert 280 not in vocab.text_ids and 300 in vocab.text_ids


# Tokens added by hand to stories260K's tokenizer (Llama 2's normalizer: Prepend("▁") and
# Replace(" ", "▁")): two matched on normalized text (add_tokens' default), one on the raw
# text, one special.
NORMALIZED_ADDED = ("zzqq", "a b")
RAW_ADDED, SPECIAL_ADDED = "qqxx", "<tool>"
added_texts = st.lists(
    st.sampled_from([*NORMALIZED_ADDED, RAW_ADDED, SPECIAL_ADDED, " ", "a", "b", "z", "q", "xy"]),
    min_size=1,
    max_size=10,
).map("".join)


def stories_with_added(tmp_root: Path) -> tuple[Any, dict[str, Vocabulary]]:
    """stories260K's tokenizer with the tokens above added, and its Vocabulary read by each
    reader: a tokenizers.Tokenizer, a transformers tokenizer wrapping it, its tokenizer.json."""
    tokenizers = pytest.importorskip("tokenizers")
    tk = tokenizers.Tokenizer.from_file(str(FIXTURES / "tokenizers/stories260K/tokenizer.json"))
    tk.add_tokens([tokenizers.AddedToken(t, normalized=True) for t in NORMALIZED_ADDED])
    tk.add_tokens([tokenizers.AddedToken(RAW_ADDED, normalized=False)])
    tk.add_special_tokens([tokenizers.AddedToken(SPECIAL_ADDED, normalized=False)])
    tk.save(str(tmp_root / "tokenizer.json"))
    vocabs = {
        "tokenizers": Vocabulary.from_tokenizer(tk),
        "json": Vocabulary.from_tokenizer_json(tmp_root),
    }
    transformers = pytest.importorskip("transformers")
    vocabs["transformers"] = Vocabulary.from_tokenizer(
        transformers.PreTrainedTokenizerFast(tokenizer_object=tk)
    )
    return tk, vocabs


class TestAddedTokens:
    @pytest.fixture(scope="class")
    def added(self, tmp_path_factory):
        return stories_with_added(tmp_path_factory.mktemp("added"))

    def test_normalized_added_token_is_word_initial(self, added):
        """An added token matched on normalized text stands for its normalized content, spelled
        as text (Llama 2: b" " + content, as a word-initial model token); others for their
        content."""
        tk, vocabs = added
        for vocab in vocabs.values():
            assert [vocab[tk.token_to_id(t)] for t in NORMALIZED_ADDED] == [b" zzqq", b" a b"]
            assert vocab[tk.token_to_id(RAW_ADDED)] == b"qqxx"
            assert tk.token_to_id(SPECIAL_ADDED) in vocab.special_ids

    @property_settings
    @given(s=added_texts)
    def test_ids_join_to_the_text(self, added, s):
        """Texts with normalized added tokens join to b" " + s, as plain text does; with any
        added token, the ids join to what the tokenizer's own decoder writes (which drops
        the first ▁'s space)."""
        tk, vocabs = added
        ids = tk.encode(s, add_special_tokens=False).ids
        decoded = tk.decode(ids, skip_special_tokens=False).encode("utf-8")
        for vocab in vocabs.values():
            joined = vocab.decode(ids, keep_special=True)
            assert joined.removeprefix(b" ") == decoded
            if RAW_ADDED not in s and SPECIAL_ADDED not in s:
                assert joined == b" " + s.encode("utf-8")

    @pytest.mark.parametrize(
        ("text", "joined"),
        [("aqqxxb", b" aqqxx b"), ("qqxxb", b"qqxx b"), ("a zzqqb", b" a zzqqb")],
    )
    def test_raw_literal_cuts_the_text(self, added, text, joined):
        """Under the Prepend normalizer a raw-matched literal is cut out before normalizing:
        the text after it gets a dummy b" " of its own and a text starting with it none (the
        docstring's exception); a normalized literal moves no dummy b" "."""
        tk, vocabs = added
        for vocab in vocabs.values():
            assert vocab.decode(tk.encode(text, add_special_tokens=False).ids) == joined

    def test_json_reader_names_a_normalizer_it_cannot_apply(self, tmp_path):
        """The json-only reader applies Llama-style normalizers; another one, met by a
        normalized added token, is an error naming it (it would otherwise guess bytes)."""
        spec = json.loads((FIXTURES / "tokenizers/stories260K/tokenizer.json").read_text())
        spec["normalizer"] = {"type": "Precompiled", "precompiled_charsmap": None}
        (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
        plain = Vocabulary.from_tokenizer_json(FIXTURES / "tokenizers/stories260K")
        # No normalized added token: the normalizer is never needed.
        assert Vocabulary.from_tokenizer_json(tmp_path).tokens == plain.tokens
        spec["added_tokens"].append(
            {"id": 512, "content": "zzqq", "special": False, "normalized": True}
        )
        (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
        with pytest.raises(ValueError, match="Precompiled"):
            Vocabulary.from_tokenizer_json(tmp_path)


# Two small tokenizers built here, with tokens added the ways real checkpoints add them: model
# pieces declared again (Llama 3's "ĠĠ", the whitespace pieces such as Gemma's "▁▁" that
# transformers' SentencePiece conversion lists as added tokens), new ones matched on the raw
# text (normalized=False) that spell the space marker or a byte piece, ones matched on
# normalized text (add_tokens' default) and a special one. The third element of each entry
# tells whether the text of the token's literal is read back by the round trip (a raw-matched
# literal or a re-declared piece spelled otherwise than its text is not).
ADDED_METASPACE = {
    "raw": ["▁▁", "a▁b", "▁x▁", "<0x42>", "<tab>"],
    "normalized": ["▁b", "zz"],
}
ADDED_BYTE_LEVEL = {
    "raw": ["ĠĠ", "Ġx", "Ġa b", "<tab>"],
    "normalized": ["Ġa", "zz"],
}
TOOL = "<tool>"  # the special one, on both


def with_added(tk, added: dict[str, list[str]]):
    """``tk`` with the tokens of ``added`` and TOOL added."""
    tokenizers = pytest.importorskip("tokenizers")
    tk.add_tokens([tokenizers.AddedToken(t, normalized=False) for t in added["raw"]])
    tk.add_tokens([tokenizers.AddedToken(t, normalized=True) for t in added["normalized"]])
    tk.add_special_tokens([tokenizers.AddedToken(TOOL, normalized=False)])
    return tk


def metaspace_unigram(scheme: str = "first"):
    """A Unigram model with byte fallback and a Metaspace pre-tokenizer and decoder
    (``prepend_scheme="first"`` by default), as newer conversions write SentencePiece models."""
    tokenizers = pytest.importorskip("tokenizers")
    pieces = ["<unk>", "▁", "▁▁", "▁a", "▁b", "▁x", *"abxyz"]
    pieces += [f"<0x{b:02X}>" for b in range(256)]
    tk = tokenizers.Tokenizer(
        tokenizers.models.Unigram([(p, -1.0 - len(p)) for p in pieces], 0, byte_fallback=True)
    )
    metaspace = {"replacement": "\u2581", "prepend_scheme": scheme}
    tk.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace(**metaspace)
    tk.decoder = tokenizers.decoders.Sequence(
        [tokenizers.decoders.ByteFallback(), tokenizers.decoders.Metaspace(**metaspace)]
    )
    return with_added(tk, ADDED_METASPACE)


def byte_level_bpe():
    """A byte-level BPE over GPT-2's 256-character alphabet with two merges."""
    tokenizers = pytest.importorskip("tokenizers")
    alphabet = sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)} | {"ĠĠ": 256, "Ġa": 257}
    tk = tokenizers.Tokenizer(tokenizers.models.BPE(vocab, [("Ġ", "Ġ"), ("Ġ", "a")]))
    tk.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = tokenizers.decoders.ByteLevel()
    return with_added(tk, ADDED_BYTE_LEVEL)


BUILT = {
    "metaspace": (metaspace_unigram, ADDED_METASPACE),
    "byte_level": (byte_level_bpe, ADDED_BYTE_LEVEL),
}
READERS = ["tokenizers", "transformers", "json"]


@functools.cache
def built(kind: str, reader: str):
    """A built tokenizer (its ``tokenizers.Tokenizer``) and its Vocabulary read by ``reader``.
    The transformers tokenizer lists the raw added tokens as extra special tokens, as
    transformers does for Gemma's whitespace pieces, though the backend flags them
    special=False."""
    tk = BUILT[kind][0]()
    if reader == "tokenizers":
        return tk, Vocabulary.from_tokenizer(tk)
    if reader == "json":
        path = Path(tempfile.mkdtemp()) / "tokenizer.json"
        try:
            tk.save(str(path))
            return tk, Vocabulary.from_tokenizer_json(path)
        finally:
            shutil.rmtree(path.parent)
    transformers = pytest.importorskip("transformers")
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tk, extra_special_tokens=BUILT[kind][1]["raw"]
    )
    return fast.backend_tokenizer, Vocabulary.from_tokenizer(fast)


class TestAddedTokensDecodeAsTheDecoder:
    @pytest.mark.parametrize("reader", READERS)
    @pytest.mark.parametrize("kind", list(BUILT))
    def test_every_id_against_decode(self, kind, reader):
        """Brute force: every model id and every raw-matched added id has the bytes the
        tokenizer's decoder writes after an anchor, decode([x, i]) minus decode([x]); a
        re-declared model piece keeps its own (Llama 3's "ĠĠ" is b"  ", not the text "ĠĠ")."""
        tk, vocab = built(kind, reader)
        anchor = tk.token_to_id("x")
        added = tk.get_added_tokens_decoder()
        model = set(tk.get_vocab(with_added_tokens=False).values())
        checked = [i for i in range(tk.get_vocab_size()) if i in model or not added[i].normalized]
        # All but the new normalized "zz": it stands for its text (see test_ids_join_to_the_text).
        assert set(range(len(vocab))) - set(checked) == {tk.token_to_id("zz")}
        for i in checked:
            expected = tk.decode([anchor, i], skip_special_tokens=False)
            assert (vocab[anchor] + vocab[i]).decode("utf-8", "replace") == expected, i

    @pytest.mark.parametrize("reader", READERS)
    @pytest.mark.parametrize("kind", list(BUILT))
    def test_only_special_tokens_are_special(self, kind, reader):
        """Only the token flagged special is special: raw-matched added tokens that
        transformers lists in all_special_ids (as it lists Gemma's "▁▁") stay text."""
        tk, vocab = built(kind, reader)
        assert vocab.special_ids == {tk.token_to_id(TOOL)}
        assert vocab[tk.token_to_id(TOOL)] == TOOL.encode()

    def test_transformers_lists_raw_added_tokens_as_special(self):
        """The premise above: transformers' all_special_ids holds the raw added tokens."""
        transformers = pytest.importorskip("transformers")
        raw = ADDED_METASPACE["raw"]
        fast = transformers.PreTrainedTokenizerFast(
            tokenizer_object=metaspace_unigram(), extra_special_tokens=raw
        )
        ids = fast.convert_tokens_to_ids(raw)
        assert set(ids) <= set(fast.all_special_ids)
        assert not any(fast.backend_tokenizer.get_added_tokens_decoder()[i].special for i in ids)

    @pytest.mark.parametrize("reader", READERS)
    def test_known_bytes(self, reader):
        """The bytes named in the docstrings: ▁ and Ġ read as spaces in raw-matched tokens,
        a byte piece as its byte, a token holding a character outside the byte alphabet as
        its UTF-8, whole; a new normalized token as its text."""
        tk, vocab = built("metaspace", reader)
        spelled = {t: vocab[tk.token_to_id(t)] for t in ["▁▁", "a▁b", "▁x▁", "<0x42>", "zz"]}
        assert spelled == {"▁▁": b"  ", "a▁b": b"a b", "▁x▁": b" x ", "<0x42>": b"B", "zz": b"zz"}
        tk, vocab = built("byte_level", reader)
        spelled = {t: vocab[tk.token_to_id(t)] for t in ["ĠĠ", "Ġx", "Ġa b", "Ġa", "zz"]}
        assert spelled == {
            "ĠĠ": b"  ",
            "Ġx": b" x",
            "Ġa b": "Ġa b".encode(),
            "Ġa": b" a",
            "zz": b"zz",
        }

    @pytest.mark.parametrize("kind", list(BUILT))
    @property_settings
    @given(data=st.data())
    def test_ids_join_to_the_text(self, kind, data):
        """Any text's ids join to what the decoder writes after an anchor. A text holding no
        special literal and no literal of an added token whose bytes are not its literal's
        UTF-8 (``▁`` read as a space) joins to the text as the Vocabulary docstring says: on
        Metaspace ("first"), after a dummy b" " unless it starts with a space or any added
        token's literal."""
        added = BUILT[kind][1]
        pieces = [*added["raw"], *added["normalized"], TOOL, "a", "b", "x", " ", "\u2581", "é"]
        s = "".join(data.draw(st.lists(st.sampled_from(pieces), max_size=8)))
        # Literals whose tokens' bytes differ from them: "<0x42>" is b"B", "Ġx" b" x", the
        # re-declared pieces "ĠĠ" and "Ġa" b"  " and b" a".
        unread = [TOOL, "<0x42>"] if kind == "metaspace" else [TOOL, "ĠĠ", "Ġx", "Ġa"]
        for reader in READERS:
            tk, vocab = built(kind, reader)
            ids = tk.encode(s, add_special_tokens=False).ids
            joined = vocab.decode(ids, keep_special=True)
            anchor = tk.token_to_id("x")
            expected = tk.decode([anchor, *ids], skip_special_tokens=False)
            assert (b"x" + joined).decode("utf-8", "replace") == expected
            if any(t in s for t in unread):
                continue
            if kind == "byte_level":
                assert joined == s.encode()
            else:
                text = s.replace("\u2581", " ").encode()
                starts_added = any(s.startswith(t) for t in added["raw"] + added["normalized"])
                prefix = b" " if text and not text.startswith(b" ") and not starts_added else b""
                assert joined == prefix + text

    @pytest.mark.parametrize(
        ("scheme", "text", "joined"),
        [
            ("first", "zzx", b"zzx"),
            ("first", "xzzx", b" xzzx"),
            ("always", "zzx", b"zz x"),
            ("always", "xzzx", b" xzz x"),
            ("always", "x<tab>x", b" x<tab> x"),
        ],
    )
    def test_metaspace_dummy_prefix_around_added_literals(self, scheme, text, joined):
        """A Metaspace pre-tokenizer sees only the text between added literals: under
        "first" a text starting with one gets no dummy b" ", under "always" each stretch
        after one gets its own (the docstring's exceptions)."""
        tk = metaspace_unigram(scheme)
        assert Vocabulary.from_tokenizer(tk).decode(tk.encode(text).ids) == joined

    def test_slow_sentencepiece_added_tokens(self):
        """A slow SentencePiece tokenizer decodes an added "a▁b" as "a b", as the fast ones."""
        transformers = pytest.importorskip("transformers")
        tok = slow_sentencepiece(transformers)
        tok.add_tokens([transformers.AddedToken("a▁b", normalized=False)])
        i = tok.convert_tokens_to_ids("a▁b")
        vocab = Vocabulary.from_tokenizer(tok)
        assert vocab[i] == b"a b" and tok.decode([i]) == "a b" and not vocab.is_special(i)


class TestShapes:
    def test_tokenizers_holes_and_added_special(self):
        """A tokenizers.Tokenizer with a gap in its BPE ids reports the gap as unused."""
        tk = pytest.importorskip("tokenizers")
        alphabet = sorted(tk.pre_tokenizers.ByteLevel.alphabet())
        bpe_vocab = {c: i for i, c in enumerate(alphabet)} | {"Ġa": 300}
        tokenizer = tk.Tokenizer(tk.models.BPE(vocab=bpe_vocab, merges=[("Ġ", "a")]))
        tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = tk.decoders.ByteLevel()
        tokenizer.add_special_tokens(["<|eot|>"])
        eot = tokenizer.token_to_id("<|eot|>")
        vocab = Vocabulary.from_tokenizer(tokenizer)
        assert len(vocab) == 301 and vocab.special_ids == {eot}
        assert vocab.unused_ids == frozenset(range(256, 300)) - {eot}
        assert vocab.decode(tokenizer.encode(" a b\n").ids) == b" a b\n"
        assert vocab.decode(tokenizer.encode(" a<|eot|>").ids, keep_special=True) == b" a<|eot|>"

    @pytest.mark.parametrize("build", ["tokenizer", "json"])
    def test_wider_logits_pad_with_unused(self, build):
        """size= beyond the tokenizer adds unused ids with empty bytes."""
        if build == "tokenizer":
            vocab = Vocabulary.from_tokenizer(hf_tokenizer("gpt2"), size=50304)
        else:
            vocab = Vocabulary.from_tokenizer_json(
                tokenizer_dir("gpt2") / "tokenizer.json", size=50304
            )
        assert len(vocab) == 50304 and vocab.unused_ids == frozenset(range(50257, 50304))
        assert vocab[50303] == b"" and 50300 not in vocab.text_ids
        assert vocab.decode([15496, 50300]) == b"Hello"
        with pytest.raises(ValueError, match="50304"):
            vocab.decode([15496, 50304])

    def test_size_too_small_names_both(self):
        """size smaller than the tokenizer raises ValueError naming both sizes."""
        with pytest.raises(ValueError, match=r"50000.*50257"):
            Vocabulary.from_tokenizer(hf_tokenizer("gpt2"), size=50000)
        with pytest.raises(ValueError, match=r"500.*512"):
            Vocabulary.from_tokenizer_json(tokenizer_dir("stories260K"), size=500)
        with pytest.raises(ValueError, match=r"50000.*50257"):
            Vocabulary.from_tokenizer(gpt2_tiktoken(), size=50000)

    def test_tokens_added_past_the_logits_are_left_out(self, caplog):
        """GPT-2 given a pad token (its embeddings not resized, as Gemma 3 ships): 50258
        tokens, 50257 logits. The added token, which the model can neither read nor
        predict, is left out with a warning; the model's own are as without it."""
        transformers = pytest.importorskip("transformers")
        tok = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir("gpt2")))
        tok.add_special_tokens({"pad_token": "[PAD]"})
        assert len(tok) == 50258
        with caplog.at_level("WARNING", logger="genlm.core._vocab"):
            vocab = Vocabulary.from_tokenizer(tok, size=50257)
        assert "['[PAD]']" in caplog.text and "left out" in caplog.text
        plain = Vocabulary.from_tokenizer(hf_tokenizer("gpt2"))
        assert vocab.tokens == plain.tokens and vocab.eos_token_ids == plain.eos_token_ids
        assert vocab.special_ids == plain.special_ids
        assert len(Vocabulary.from_tokenizer(tok)) == 50258

    def test_slow_sentencepiece_tokenizer(self):
        """A SentencePiece-backed transformers tokenizer gives the tokenizer.json's bytes."""
        transformers = pytest.importorskip("transformers")
        tok = slow_sentencepiece(transformers)
        assert getattr(tok, "backend_tokenizer", None) is None
        vocab = Vocabulary.from_tokenizer(tok)
        assert vocab.tokens == vocab_from_json("stories260K").tokens
        assert vocab.special_ids == {0, 1, 2} and (
            vocab.bos_token_id,
            vocab.eos_token_ids,
        ) == (1, (2,))
        ids = tok.encode("Hello world, naïve 🙂", add_special_tokens=False)
        assert vocab.decode(ids) == " Hello world, naïve 🙂".encode()


class TestUnusualTokenizers:
    def test_a_pad_token_the_tokenizer_does_not_hold(self):
        """``pad_token = "[PAD]"`` on a tokenizer with no unk token lists the id None among
        the special ids (transformers does); the vocabulary is the one without it (reading it
        failed with an unrelated TypeError, so no model could load)."""
        transformers = pytest.importorskip("transformers")
        path = str(tokenizer_dir("gpt2"))
        tok = transformers.AutoTokenizer.from_pretrained(path, unk_token=None)
        tok.pad_token = "[PAD]"
        assert None in tok.all_special_ids  # the premise
        vocab = Vocabulary.from_tokenizer(tok)
        plain = Vocabulary.from_tokenizer(transformers.AutoTokenizer.from_pretrained(path))
        assert vocab.tokens == plain.tokens and vocab.special_ids == plain.special_ids

    def test_unigram_byte_fallback_without_a_byte_fallback_decoder(self, tmp_path):
        """A Unigram model with byte fallback keeps the flag in its state only: its byte
        pieces are the bytes of the text they encode, by either reader (the tokenizers
        reader spelled them "<0xC3>")."""
        tokenizers = pytest.importorskip("tokenizers")
        pieces = [("<unk>", 0.0), ("▁hello", -1.0), ("▁", -2.0)]
        pieces += [(f"<0x{b:02X}>", -10.0) for b in range(256)]
        tk = tokenizers.Tokenizer(tokenizers.models.Unigram(pieces, 0, byte_fallback=True))
        metaspace = {"replacement": "▁", "prepend_scheme": "always"}
        tk.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace(**metaspace)
        tk.decoder = tokenizers.decoders.Metaspace(**metaspace)
        tk.save(str(tmp_path / "tokenizer.json"))
        ids = tk.encode("hello é").ids
        for vocab in (Vocabulary.from_tokenizer(tk), Vocabulary.from_tokenizer_json(tmp_path)):
            assert vocab.decode(ids) == " hello é".encode()

    def test_slow_tokenizer_with_bytes_pieces(self):
        """A slow tokenizer whose pieces are bytes (Qwen-1's wraps tiktoken): each token is
        its piece's bytes (it failed with "expected str instance, bytes found")."""
        transformers = pytest.importorskip("transformers")
        ranks = {bytes([b]): b for b in range(256)} | {b" hello": 256, b"\xc3\xa9": 257}
        names = {i: piece for piece, i in ranks.items()} | {258: "<|endoftext|>"}

        class BytesPieces(transformers.PreTrainedTokenizer):
            def __len__(self):
                return len(names)

            @property
            def vocab_size(self):
                return len(names)

            def get_vocab(self):
                return dict(ranks)

            def _convert_id_to_token(self, i):
                return names[i]

            def _convert_token_to_id(self, token):
                return ranks.get(token, 0)

        vocab = Vocabulary.from_tokenizer(BytesPieces(eos_token="<|endoftext|>"))
        assert vocab.tokens[:258] == tuple(ranks)
        assert vocab.eos_token_ids == (258,) and 258 in vocab.special_ids

    def test_two_tokens_with_one_id_are_refused_by_both_readers(self, tmp_path):
        """A tokenizer.json giving two tokens one id: the tokenizers library decodes the id
        to either token from one process to the next, so both readers refuse it, naming
        them (the tokenizers reader took whichever its unordered vocabulary listed last)."""
        tokenizers = pytest.importorskip("tokenizers")
        vocab = {"<unk>": 0, "a": 1, "b": 2}
        tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>")).save(
            str(tmp_path / "tokenizer.json")
        )
        spec = json.loads((tmp_path / "tokenizer.json").read_text())
        spec["model"]["vocab"]["c"] = 2  # saving would drop it: written by hand
        (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
        tk = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
        for read in (
            lambda: Vocabulary.from_tokenizer_json(tmp_path),
            lambda: Vocabulary.from_tokenizer(tk),
        ):
            with pytest.raises(ValueError, match="tokens '[bc]' and '[bc]' both have id 2"):
                read()

    def test_a_decoder_that_is_not_byte_exact_is_named(self, caplog):
        """A BPE decoder turning a "</w>" suffix into a space gives no token bytes of its own:
        reading it logs a warning naming the decoder, rather than passing in silence."""
        tokenizers = pytest.importorskip("tokenizers")
        vocab = {"<unk>": 0, "h": 1, "i": 2, "hi</w>": 3, "i</w>": 4}
        tk = tokenizers.Tokenizer(tokenizers.models.BPE(vocab, [], unk_token="<unk>"))
        tk.decoder = tokenizers.decoders.BPEDecoder(suffix="</w>")
        with caplog.at_level("WARNING", logger="genlm.core._vocab"):
            read = Vocabulary.from_tokenizer(tk)
        assert "BPEDecoder" in caplog.text and "not byte-exact" in caplog.text
        assert read.tokens[3] == b"hi</w>"  # the raw text, as documented
        caplog.clear()
        with caplog.at_level("WARNING", logger="genlm.core._vocab"):
            Vocabulary.from_tokenizer(hf_tokenizer("gpt2"))
        assert caplog.text == ""


class TestMalformedInput:
    @pytest.mark.parametrize(
        ("spec", "match"),
        [
            # A negative id used as an index would overwrite the token at the end ("c").
            ({"model": {"vocab": {"a": 0, "b": 1, "c": 2, "z": -1}}}, "'z' has id -1"),
            ({"model": {"vocab": {"a": 0, "z": -3}}}, "'z' has id -3"),
            ({"model": {"vocab": {"a": 0, "z": 1.0}}}, "'z' has id 1.0"),
            ({"model": {"vocab": {"a": 0, "z": True}}}, "'z' has id True"),
            ({"model": {"vocab": {"a": "0"}}}, "'a' has id '0'"),
            ({"model": {"vocab": ["a", "b"]}}, "Unigram vocab entry 'a'"),
            ({"model": {"vocab": "ab"}}, "'vocab' is 'ab'"),
            ({"model": [1]}, "'model' is \\[1\\]"),
            ({"added_tokens": [{"id": -1, "content": "<s>"}]}, "'<s>' has id -1"),
            ({"added_tokens": [{"content": "<s>"}]}, "'<s>' has id None"),
            ({"added_tokens": [{"id": 0}]}, "string 'content'"),
            ({"added_tokens": {"id": 0}}, "'added_tokens' is"),
            ([1, 2], "holds \\[1, 2\\], not a tokenizer.json object"),
            ({"model": {"vocab": {"a": 0, "b": 0}}}, "'a' and 'b' both have id 0"),
            ({}, "no tokens at all"),
            ({"model": []}, "no tokens at all"),
            # Components missing a field (a pattern given as a bare string, a Prepend with
            # nothing to prepend, a Metaspace with no replacement) broke with AttributeError,
            # KeyError and TypeError.
            (
                {"model": {"vocab": {"a": 0}}, "decoder": {"type": "Replace", "pattern": "x"}},
                "is malformed: AttributeError",
            ),
            (
                {
                    "model": {"vocab": {"a": 0}},
                    "normalizer": {"type": "Prepend"},
                    "added_tokens": [{"id": 1, "content": "zz", "special": False}],
                },
                "is malformed: KeyError: 'prepend'",
            ),
            (
                {
                    "model": {"vocab": {"▁a": 0}},
                    "decoder": {"type": "Metaspace", "replacement": None},
                },
                "is malformed: TypeError",
            ),
        ],
    )
    def test_malformed_tokenizer_json(self, tmp_path, spec, match):
        """A malformed tokenizer.json is a ValueError naming what is wrong, never another
        token's bytes overwritten, an IndexError or an AttributeError."""
        (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
        with pytest.raises(ValueError, match=match):
            Vocabulary.from_tokenizer_json(tmp_path)

    @pytest.mark.parametrize(
        ("size", "error", "match"),
        [
            (4.0, TypeError, "size: 4.0 \\(float\\) is not an integer"),
            ("4", TypeError, "size: '4' \\(str\\) is not an integer"),
            (True, TypeError, "size: True is a bool"),
            (np.bool_(True), TypeError, "is a bool"),
            (-1, ValueError, "size=-1 is negative"),
        ],
    )
    def test_bad_size(self, tmp_path, size, error, match):
        """size= is an integer (a float broke with an unrelated message, True was read as 1)."""
        (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {}}}))
        with pytest.raises(error, match=match):
            Vocabulary.from_tokenizer_json(tmp_path, size=size)
        with pytest.raises(error, match=match):
            Vocabulary.from_tokenizer(gpt2_tiktoken(), size=size)

    def test_numpy_size(self, tmp_path):
        """A numpy integer is a size like a Python one."""
        (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 0}}}))
        vocab = Vocabulary.from_tokenizer_json(tmp_path, size=np.int64(3))
        assert vocab.tokens == (b"a", b"", b"") and vocab.unused_ids == {1, 2}


class TestVocabulary:
    def test_construction_validates(self):
        """Out-of-range ids, unused ids with bytes and non-bytes tokens are refused when built."""
        with pytest.raises(ValueError, match="5"):
            Vocabulary((b"a", b"b"), special_ids={5})
        with pytest.raises(ValueError, match="unused"):
            Vocabulary((b"a", b"b"), unused_ids={1})
        with pytest.raises(ValueError, match="both"):
            Vocabulary((b"a", b""), special_ids={1}, unused_ids={1})
        with pytest.raises(TypeError, match="str"):
            Vocabulary((b"a", "b"))

    def test_small_vocabulary_api(self):
        """Indexing, specials, byte_vocab, text_ids and decode behave on a hand-built vocabulary."""
        vocab = Vocabulary(
            (b"a", b"a", b"<s>", b""), special_ids={2}, unused_ids={3}, bos_token_id=2
        )
        assert (
            len(vocab) == 4 and vocab[1] == b"a" and vocab.byte_vocab == [b"a", b"a", b"<s>", b""]
        )
        assert vocab.is_special(2) and not vocab.is_special(0)
        assert vocab.text_ids.tolist() == [0, 1]
        assert vocab.decode(np.array([2, 0, 1, 3])) == b"aa"
        assert vocab.decode([2, 0], keep_special=True) == b"<s>a"
        with pytest.raises(IndexError):
            vocab[4]
        with pytest.raises(ValueError, match="-1"):
            vocab.decode([0, -1])

    @pytest.mark.parametrize(
        ("call", "message"),
        [
            (lambda v: v.decode([1.7]), r"decode: 1\.7 \(float\)"),  # int() made it b"b"
            (lambda v: v.decode("12"), "decode takes token ids, not str"),
            (lambda v: v.decode(b"\x01"), "decode takes token ids, not bytes"),
            (lambda v: v.decode(bytearray(b"\x01")), "decode takes token ids, not bytearray"),
            (lambda v: v.decode(memoryview(b"\x01")), "decode takes token ids, not memoryview"),
            (lambda v: v.decode(np.array([0.9, 2.2])), r"decode: .*0\.9.* is not an integer"),
            (lambda v: v.decode(np.array([True])), r"decode: .*True.* is a bool"),
            (lambda v: v[np.True_], r"Vocabulary index: .*True.* is a bool"),
            (lambda v: v.decode([0, True]), "decode: True is a bool"),
            (lambda v: v.decode([np.float64(1.0)]), "decode: .* is not an integer"),
            (lambda v: v[2.9], r"Vocabulary index: 2\.9"),
            (lambda v: v["1"], "Vocabulary index: '1'"),
            (lambda v: v.is_special(3.5), r"is_special: 3\.5"),
        ],
    )
    def test_ids_that_are_not_integers_are_refused(self, call, message):
        """decode, indexing and is_special refuse ids that are not integers by name: int()
        truncated 1.7 to 1, read "12" as ids 1 and 2 and True as 1."""
        vocab = Vocabulary((b"a", b"b", b"c", b"<s>"), special_ids={3})
        with pytest.raises(TypeError, match=message):
            call(vocab)

    def test_numpy_integer_ids_are_ids(self):
        """numpy integers (scalars, arrays of any integer dtype) are ids like Python ints."""
        vocab = Vocabulary((b"a", b"b", b"c", b"<s>"), special_ids={3})
        assert vocab.decode([np.int64(1), np.uint8(0)]) == b"ba"
        assert vocab.decode(np.array([3, 2, 0], dtype=np.int32)) == b"ca"
        assert vocab.decode(np.array([3, 2], dtype=np.uint16), keep_special=True) == b"<s>c"
        assert vocab[np.int32(2)] == b"c" and vocab.is_special(np.int64(3))
        # Arrays of other dtypes are read id by id: numpy's default empty array (float64)
        # holds no id, an object array Python ints.
        assert vocab.decode(np.array([])) == b""
        assert vocab.decode(np.array([1, 2], dtype=object)) == b"bc"

    @pytest.mark.parametrize(
        ("field", "value", "message"),
        [
            ("special_ids", {True}, "special_ids: True is a bool"),
            ("special_ids", {1.0}, r"special_ids: 1\.0 \(float\)"),
            ("special_ids", 1, "special_ids must be a collection of token ids"),
            ("unused_ids", [1.5], r"unused_ids: 1\.5"),
            ("eos_token_ids", [1.0], r"eos_token_ids: 1\.0 \(float\)"),  # kept as (1.0,)
            ("eos_token_ids", "1", "eos_token_ids must be a collection of token ids"),
            ("bos_token_id", 1.0, r"bos_token_id: 1\.0"),
            ("bos_token_id", True, "bos_token_id: True is a bool"),
        ],
    )
    def test_named_ids_must_be_integers(self, field, value, message):
        """The ids a vocabulary names are integers, checked when it is built."""
        with pytest.raises(TypeError, match=message):
            Vocabulary((b"a", b""), **{field: value})

    def test_named_numpy_ids_become_ints(self):
        """numpy integer ids are stored as Python ints (equal and hashing alike)."""
        vocab = Vocabulary(
            (b"a", b"b", b""),
            special_ids=np.array([1]),
            unused_ids=[np.int32(2)],
            bos_token_id=np.int64(1),
            eos_token_ids=(np.uint8(0),),
        )
        named = [*vocab.special_ids, *vocab.unused_ids, vocab.bos_token_id, *vocab.eos_token_ids]
        assert named == [1, 2, 1, 0] and {type(i) for i in named} == {int}

    def test_unknown_tokenizer_type(self):
        """An object that is no known tokenizer is refused with a TypeError naming its type."""
        with pytest.raises(TypeError, match="dict"):
            Vocabulary.from_tokenizer({})

    def test_import_is_light(self):
        """Importing genlm.core._vocab loads none of transformers, tokenizers, tiktoken or torch."""
        heavy = ("transformers", "tokenizers", "tiktoken", "torch")
        assert modules_loaded_by("import genlm.core._vocab", heavy) == []


def test_the_models_eos_ids_join_the_tokenizers(caplog):
    """A generation configuration's ``eos_token_id`` (an id, a list, None) adds its ids after
    the tokenizer's, each once; one that is no token id of the vocabulary is left out with
    a warning (a stale configuration must not stop a model from loading)."""
    vocab = Vocabulary(tuple(bytes([b]) for b in range(8)), eos_token_ids=[5])
    assert vocab.with_model_eos(None) is vocab
    assert vocab.with_model_eos(5) is vocab
    assert vocab.with_model_eos(np.int64(2)).eos_token_ids == (5, 2)
    assert vocab.with_model_eos([7, 5, 1, 7]).eos_token_ids == (5, 7, 1)
    widened = vocab.with_model_eos([3])
    assert widened.tokens == vocab.tokens and widened.special_ids == vocab.special_ids
    with caplog.at_level("WARNING", logger="genlm.core._vocab"):
        assert vocab.with_model_eos([8, -1, True, 2.0, 4]).eos_token_ids == (5, 4)
        assert vocab.with_model_eos("2") is vocab
    assert len(caplog.records) == 5
    assert "not a token id of this 8-token vocabulary" in caplog.records[0].getMessage()
