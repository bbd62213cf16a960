"""genlm.backend.tokenization: Token semantics and decode_vocab's exactness check."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import numpy as np
import pytest
import transformers

from genlm.backend import decode_vocab as top_level_decode_vocab
from genlm.backend.llm import MockAsyncLM
from genlm.backend.tokenization import Token, decode_vocab
from genlm.core import ModelClosedError, Vocabulary
from genlm.core.mock import MockLM

GPT2_TOKENIZER = Path(__file__).parents[1] / "fixtures" / "tokenizers" / "gpt2"


def test_token_is_bytes_with_an_id_and_hashes_by_id():
    a, b = Token(3, b"ab"), Token(7, b"ab")
    assert isinstance(a, bytes) and a == b"ab" and a.decode() == "ab"
    assert (a.token_id, a.byte_string, type(a.byte_string)) == (3, b"ab", bytes)
    assert a != b and len({a, b}) == 2  # same bytes, different ids: different tokens
    assert hash(a) == hash(3) and b"ab" not in {a}  # a set of tokens is keyed by id
    assert Token.is_plain_bytes(b"ab") and not Token.is_plain_bytes(a)
    assert not Token.is_plain_bytes("ab")
    assert type(Token.as_bytes(a)) is bytes and Token.as_bytes(a) == b"ab"
    assert Token.as_bytes(bytearray(b"x")) == b"x"
    for clone in (pickle.loads(pickle.dumps(a)), copy.deepcopy(a)):
        assert type(clone) is Token and clone.token_id == 3 and clone == a
    assert repr(a) == "Token(3, b'ab')"
    with pytest.raises(TypeError):
        Token(1, "ab")


def test_tokens_order_by_id_and_keep_their_id_and_bytes():
    """As genlm-backend's: sorting tokens gives id order (it gave byte order), the bytes
    cannot be reassigned apart from the token (they could, and the token kept comparing
    by the old ones), and an id must be an integer (5.7 became 5)."""
    tokens = [Token(3, b"a"), Token(1, b"c"), Token(2, b"b")]
    assert [t.token_id for t in sorted(tokens)] == [1, 2, 3]
    assert max(tokens).token_id == 3 and Token(1, b"z") < Token(2, b"a")
    assert Token(2, b"b") < b"c"  # against plain bytes, the bytes' order
    with pytest.raises(AttributeError):
        tokens[0].byte_string = b"zz"
    assert Token(np.int64(4), b"x").token_id == 4
    for bad in (5.7, True, "5"):
        with pytest.raises(TypeError, match="token_id"):
            Token(bad, b"a")


def test_decode_vocab_equals_the_core_vocabulary_on_gpt2():
    tok = transformers.AutoTokenizer.from_pretrained(GPT2_TOKENIZER)
    byte_vocab, str_vocab = decode_vocab(tok)
    expected = Vocabulary.from_tokenizer(tok).tokens
    assert [t.byte_string for t in byte_vocab] == list(expected)
    assert [t.token_id for t in byte_vocab] == list(range(len(expected)))
    space_the = tok.convert_tokens_to_ids("Ġthe")
    assert byte_vocab[space_the] == b" the" and str_vocab[space_the] == " the"
    # A lone byte of a multi-byte character: str_vocab falls back to the tokenizer's name
    # for the token, distinct per id as genlm-backend's (decode([id]) gave "\ufffd" for all
    # 344 of GPT-2's, so str_vocab could not be mapped back to ids).
    partial = tok.convert_tokens_to_ids("Ã")  # GPT-2's character for byte 0xC3
    assert byte_vocab[partial] == b"\xc3" and str_vocab[partial] == "Ã"
    pieces = [i for i, t in enumerate(byte_vocab) if not _is_utf8(t)]
    assert len(pieces) > 300 and len({str_vocab[i] for i in pieces}) == len(pieces)
    assert decode_vocab(tok, byte2str_fallback="latin1")[1][partial] == "\xc3"
    assert top_level_decode_vocab is decode_vocab


def test_decode_vocab_raises_on_a_wordpiece_tokenizer(tmp_path):
    """WordPiece drops the spaces between words: its bytes cannot be recovered exactly."""
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello", ",", "world", "!", "it", "'", "s"]
    words += ["42", "degrees", ".", "##s"]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    bert = transformers.BertTokenizerFast.from_pretrained(tmp_path)  # vocab_file= reads no
    # words on transformers 5: every word would be [UNK]
    assert bert.tokenize("hello world") == ["hello", "world"]
    with pytest.raises(ValueError, match="Could not decode byte representation"):
        decode_vocab(bert)
    # The model classes refuse it too, as genlm-backend's did (its AsyncLM read the
    # vocabulary with decode_vocab); they published a byte_vocab joining "hello world" to
    # b"helloworld". A core model made for a facade that refuses it is closed.
    with pytest.raises(ValueError, match="Could not decode byte representation"):
        MockAsyncLM(bert)
    core = MockLM(Vocabulary.from_tokenizer(bert), tokenizer=bert)
    with pytest.raises(ValueError, match="Could not decode byte representation"):
        MockAsyncLM._wrap(core)
    with pytest.raises(ModelClosedError):
        core.next_token_logprobs_sync([4])
    with pytest.raises(ValueError, match="byte2str_fallback"):
        decode_vocab(transformers.AutoTokenizer.from_pretrained(GPT2_TOKENIZER), "bogus")


def test_an_exact_tokenizer_with_a_small_alphabet_is_accepted(tmp_path):
    """A lowercase Unigram tokenizer without byte fallback (a user-trained or protein one)
    spells "hello world" exactly but reads the probe text's capitals, digits and punctuation
    as its unknown token: it was refused as inexact (0.3.1 serves it). The probe keeps what
    the tokenizer can spell; a WordPiece vocabulary missing some probe words still fails."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    letters = "abcdefghijklmnopqrstuvwxyz"
    pieces = [("<unk>", 0.0), *((c, -1.0) for c in letters), *(("▁" + c, -1.5) for c in letters)]
    unigram = Tokenizer(models.Unigram([*pieces, ("▁", -2.0)], unk_id=0, byte_fallback=False))
    unigram.pre_tokenizer, unigram.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    small = transformers.PreTrainedTokenizerFast(tokenizer_object=unigram, unk_token="<unk>")
    byte_vocab, _ = decode_vocab(small)
    ids = small.encode("hello world", add_special_tokens=False)
    assert b"".join(byte_vocab[i].byte_string for i in ids) in (b"hello world", b" hello world")
    MockAsyncLM(small).close()
    # Missing some probe words; then with no single character at all (nothing of the probe
    # is spelled alone, so the whole probe is judged).
    for words in (["hello", "world", "it", "s", "degrees"], ["hello", "world", "degrees"]):
        words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", *words]
        (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
        bert = transformers.BertTokenizerFast.from_pretrained(tmp_path)
        assert bert.tokenize("hello world") == ["hello", "world"]
        with pytest.raises(ValueError, match="Could not decode byte representation"):
            decode_vocab(bert)


def test_the_top_level_names_are_genlm_backend_031s():
    """``from genlm.backend import X`` works for every name genlm-backend 0.3.1's package
    exports (its ``__init__``), each the submodule's own object."""
    import genlm.backend as top
    from genlm.backend import llm, tokenization, trie

    published = {
        "load_model_by_name": llm,
        "AsyncVirtualLM": llm,
        "AsyncTransformer": llm,
        "decode_vocab": tokenization,
        "Token": tokenization,
        "TokenCharacterTrie": trie,
        "ParallelTokenCharacterTrie": trie,
        "AsyncTokenCharacterTrie": trie,
    }
    assert set(top.__all__) == set(published)
    for name, module in published.items():
        assert getattr(top, name) is getattr(module, name), name


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_added_tokens_join_back_to_their_text():
    """The two added-token cases the README lists apart from 0.3.1: a normalized token under
    stories260K's Prepend normalizer is its normalized text (0.3.1: b"zzqq"), and GPT-2's
    "Ġx" added again keeps the model piece's b" x" (0.3.1: its literal b"\xc4\xa0x")."""
    stories = transformers.AutoTokenizer.from_pretrained(GPT2_TOKENIZER.parent / "stories260K")
    stories.add_tokens(["zzqq"])
    byte_vocab, str_vocab = decode_vocab(stories)
    ids = stories.encode("a zzqq", add_special_tokens=False)
    assert ids[-1] == stories.convert_tokens_to_ids("zzqq")
    assert (byte_vocab[ids[-1]], str_vocab[ids[-1]]) == (b" zzqq", " zzqq")
    assert b"".join(byte_vocab[i] for i in ids) == b" a zzqq"
    gpt2 = transformers.AutoTokenizer.from_pretrained(GPT2_TOKENIZER)
    space_x = gpt2.convert_tokens_to_ids("Ġx")
    gpt2.add_tokens(["Ġx"])
    assert gpt2.convert_tokens_to_ids("Ġx") == space_x
    byte_vocab, str_vocab = decode_vocab(gpt2)
    assert (byte_vocab[space_x], str_vocab[space_x]) == (b" x", " x")
    assert gpt2.decode([87, space_x]) == "x x"
