"""Bad tokenizer data gets one clear ModelFormatError, quickly: chat templates that would run for ever,
allocate gigabytes or raise anything; GGUF tokenizer keys of the wrong kind, size or range; vocabularies
that made the build quadratic; Hugging Face tokenizer files of the wrong shape."""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import time

import numpy as np
import pytest

from shaderlm.errors import ModelFormatError
from shaderlm.formats import tokenizer as tk
from shaderlm.formats.hf_tokenizer import HFTokenizer
from shaderlm.formats.tokenizer import Tokenizer, read_gguf_metadata
from shaderlm.synth import write_hf_tokenizer

GUARD_S = 20      # seconds: a guarded test still running then has hung, and fails


class _Hung(BaseException):
    """Not an Exception: no ``except Exception`` on the way may turn a hang into a pass."""


@pytest.fixture
def guard():
    """Fail, rather than hang, a test that runs past GUARD_S (where there are alarms: not on Windows)."""
    if not hasattr(signal, "setitimer"):
        yield
        return

    def ring(signum, frame):
        raise _Hung(f"still running after {GUARD_S} s")

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, GUARD_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def bpe_meta(tiny_gguf):
    """The metadata of the tiny synthetic model: a byte-level BPE vocabulary of 300 tokens."""
    return read_gguf_metadata(tiny_gguf)


def spm_meta(extra=()):
    """A small SentencePiece vocabulary, with ``extra`` pieces appended."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["▁", "h", "e", "he", *extra]
    n = len(tokens)
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [2, 3, 3] + [6] * 256 + [1] * (n - 259),
            "tokenizer.ggml.scores": [-float(i) for i in range(n)],
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2}


@pytest.fixture
def chat(bpe_meta):
    """render(template) with the tiny model, the template being its tokenizer.chat_template."""
    tok = Tokenizer.from_metadata(bpe_meta)

    def render(template):
        tok.chat_template = template
        return tok.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
    return render


# ---------------------------------------------------------------------------------------------------
# chat templates


def test_template_string_multiplication_is_refused_before_allocating(chat, guard):
    t0 = time.monotonic()
    with pytest.raises(ModelFormatError, match=r"tokenizer\.chat_template.*'\*' would make .*3000000000"):
        chat("{{ 'a' * 3000000000 }}")
    assert time.monotonic() - t0 < 1


@pytest.mark.parametrize("template, words", [
    ("{{ [1] * 100000 * 100000 }}", r"'\*'"),
    ("{{ 7 ** 100000000 }}", r"'\*\*'"),
    ("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", "'\\+'"),
    ("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "'~'"),
])
def test_template_values_are_bounded(chat, guard, template, words):
    with pytest.raises(ModelFormatError, match=f"tokenizer\\.chat_template.*{words}"):
        chat(template)


def test_template_recursion(chat, guard):
    with pytest.raises(ModelFormatError, match=r"tokenizer\.chat_template.*RecursionError"):
        chat("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}")


@pytest.mark.parametrize("template", [
    "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
    "{% for a in range(100000) if a >= 0 %}{% for b in range(100000) if b >= 0 %}{% endfor %}{% endfor %}",
    "{% macro f() %}{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}"
    "{% endmacro %}{{ f() }}",
    "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(80) }}",
], ids=["nested-loops", "filtered-loops", "loops-in-macro", "branching-macro"])
def test_template_time_limit(chat, guard, monkeypatch, template):
    monkeypatch.setattr(tk, "MAX_CHAT_SECONDS", 0.2)
    t0 = time.monotonic()
    with pytest.raises(ModelFormatError, match=r"tokenizer\.chat_template.*more than 0\.2 s"):
        chat(template)
    assert time.monotonic() - t0 < 2


def test_template_output_limit(chat, guard, monkeypatch):
    monkeypatch.setattr(tk, "MAX_CHAT_OUTPUT", 1000)
    with pytest.raises(ModelFormatError, match="longer than 1000 characters"):
        chat("{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}")
    assert chat("{{ 'x' * 1000 }}") == "x" * 1000


def test_template_default_limits_stop_the_nested_loops(chat, guard):
    t0 = time.monotonic()
    with pytest.raises(ModelFormatError, match="tokenizer.chat_template"):
        chat("{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}")
    assert time.monotonic() - t0 < tk.MAX_CHAT_SECONDS + 2


@pytest.mark.parametrize("template, words", [
    ("{{ 1/0 }}", "ZeroDivisionError"),
    ("{{ 1 + 'a' }}", "TypeError"),
    ("{{ 2.0 ** 10000 }}", "OverflowError"),
    ("{% for i in range(10**10) %}{% endfor %}", "OverflowError"),
    ("{{ messages.__class__.__name__ }}", "SecurityError"),
    ("{{ nothing() }}", "UndefinedError"),
    ("{% for %}", "syntax error on line 1"),
    ("{{ raise_exception('roles must alternate') }}", "roles must alternate"),
])
def test_template_exceptions_are_model_format_errors(chat, template, words):
    with pytest.raises(ModelFormatError, match=f"chat template \\(tokenizer\\.chat_template\\) failed: .*{words}"):
        chat(template)


def test_template_given_or_built_in_is_named(bpe_meta):
    tok = Tokenizer.from_metadata({k: v for k, v in bpe_meta.items() if k != "tokenizer.chat_template"})
    with pytest.raises(ModelFormatError, match="the template passed in"):
        tok.apply_chat_template([], template="{{ 1/0 }}")
    tok.fallback_template = "{{ 1/0 }}"
    with pytest.raises(ModelFormatError, match="the built-in chat template"):
        tok.apply_chat_template([])


def test_template_loops_render_as_jinja_does(chat):
    """Every loop is routed through the time check: what loops render must not change."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    for template in [
        "{% for m in messages %}{{ loop.index }}/{{ loop.length }}{{ m.role }}{% if loop.last %}.{% endif %}"
        "{{ loop.revindex }}{{ loop.cycle('a', 'b') }}{% endfor %}",
        "{% for m in messages if m.role == 'user' %}{{ m.content }}{{ loop.first }}{% endfor %}",
        "{% for x in [] %}x{% else %}empty{% endfor %}",
        "{% for k, v in {'a': 1}.items() %}{{ k }}{{ v }}{% endfor %}",
        "{% for x in [[1, [2]], 3] recursive %}{% if x is iterable %}({{ loop(x) }}){% else %}{{ x }}{% endif %}"
        "{% endfor %}",
        "{% for c in 'abc' %}{{ c ~ loop.index0 }}{% if loop.changed(c) %}!{% endif %}{% endfor %}",
    ]:
        assert chat(template) == plain.from_string(template).render(messages=messages), template


# ---------------------------------------------------------------------------------------------------
# GGUF tokenizer keys


@pytest.mark.parametrize("key, value, words", [
    ("tokenizer.ggml.model", ["gpt2"], "tokenizer.ggml.model.*a string"),
    ("tokenizer.ggml.tokens", "abc", "tokenizer.ggml.tokens.*array of strings"),
    ("tokenizer.ggml.tokens", np.arange(300, dtype=np.int32), "tokenizer.ggml.tokens.*array of strings"),
    ("tokenizer.ggml.tokens", ["a", 5, "b"], "tokenizer.ggml.tokens.*array of strings"),
    ("tokenizer.ggml.token_type", "normal", "tokenizer.ggml.token_type.*array of integers"),
    ("tokenizer.ggml.token_type", np.full(300, np.nan, np.float32), "tokenizer.ggml.token_type.*array of integers"),
    ("tokenizer.ggml.token_type", [1] * 299, "tokenizer.ggml.token_type.*299 entries for 300 tokens"),
    ("tokenizer.ggml.token_type", [1] * 301, "tokenizer.ggml.token_type.*301 entries for 300 tokens"),
    ("tokenizer.ggml.scores", ["x"] * 300, "tokenizer.ggml.scores.*array of numbers"),
    ("tokenizer.ggml.scores", np.zeros((300, 2)), "tokenizer.ggml.scores.*array of numbers"),
    ("tokenizer.ggml.scores", 1.5, "tokenizer.ggml.scores.*array of numbers"),
    ("tokenizer.ggml.scores", [0.0] * 10, "tokenizer.ggml.scores.*10 entries for 300 tokens"),
    ("tokenizer.ggml.bos_token_id", "one", "tokenizer.ggml.bos_token_id.*an integer"),
    ("tokenizer.ggml.bos_token_id", 1.0, "tokenizer.ggml.bos_token_id.*an integer"),
    ("tokenizer.ggml.bos_token_id", True, "tokenizer.ggml.bos_token_id.*an integer"),
    ("tokenizer.ggml.bos_token_id", np.array([1]), "tokenizer.ggml.bos_token_id.*an integer"),
    ("tokenizer.ggml.eos_token_id", -5, "tokenizer.ggml.eos_token_id.* -5 is outside the vocabulary"),
    ("tokenizer.ggml.pre", ["gpt-2"], "tokenizer.ggml.pre.*a string"),
    ("tokenizer.ggml.merges", np.array([1, 2, 3], np.uint32), "tokenizer.ggml.merges.*array of strings"),
    ("tokenizer.ggml.merges", "a b", "tokenizer.ggml.merges.*array of strings"),
    ("tokenizer.chat_template", ["{{ messages }}", "x"], "tokenizer.chat_template.*a string"),
    ("tokenizer.chat_template", 5, "tokenizer.chat_template.*a string"),
])
def test_gguf_key_of_the_wrong_kind(bpe_meta, key, value, words):
    with pytest.raises(ModelFormatError, match=words):
        Tokenizer.from_metadata(dict(bpe_meta, **{key: value}))


def test_gguf_ids_past_the_vocabulary_are_ignored_as_llama_cpp_does(bpe_meta):
    """llama.cpp warns about a special token id past the vocabulary and keeps its default (real files
    carry such ids); a negative id is malformed."""
    with pytest.warns(UserWarning, match="padding_token_id = 300"):
        tok = Tokenizer.from_metadata(dict(bpe_meta, **{"tokenizer.ggml.padding_token_id": 300}))
    assert tok.pad_id is None
    with pytest.warns(UserWarning, match="bos_token_id = 300"):
        tok = Tokenizer.from_metadata(dict(bpe_meta, **{"tokenizer.ggml.bos_token_id": 300}))
    assert tok.bos_id is None                     # a BPE vocabulary has no default BOS
    with pytest.warns(UserWarning, match="eos_token_id = 400"):
        tok = Tokenizer.from_metadata(dict(spm_meta(), **{"tokenizer.ggml.eos_token_id": 400}))
    assert tok.eos_id == 2                        # SentencePiece's default


def test_spm_token_too_long(guard):
    t0 = time.monotonic()
    with pytest.raises(ModelFormatError, match="tokenizer.ggml.tokens.*200000 characters long"):
        Tokenizer.from_metadata(spm_meta(["h" * 200_000]))
    assert time.monotonic() - t0 < 1


def test_spm_build_is_linear_in_long_tokens(guard):
    """Tokens as long as allowed, each the one before it and one more character: what each is cut into is
    found without slicing every prefix of it."""
    n = tk.MAX_TOKEN_CHARS
    meta = spm_meta(["h" * k for k in range(n - 40, n + 1)])
    t0 = time.monotonic()
    Tokenizer.from_metadata(meta)
    assert time.monotonic() - t0 < 5
    tokens = meta["tokenizer.ggml.tokens"]
    tok2id = {t: i for i, t in enumerate(tokens)}
    cuts = [("h", "e")] + [cut for k in range(n - 39, n + 1) for cut in (("h", "h" * (k - 1)), ("h" * (k - 1), "h"))]
    assert tk._spm_merges(tokens, range(len(tokens)), tok2id) == cuts


def test_spm_merges_are_bounded(monkeypatch, guard):
    monkeypatch.setattr(tk, "MAX_SPM_MERGE_CHARS", 100_000)
    with pytest.raises(ModelFormatError, match="tokenizer.ggml.tokens.*merges.*exceed 100000 characters"):
        Tokenizer.from_metadata(spm_meta(["h" * k for k in range(3, 200)]))


@pytest.mark.parametrize("short", [1, 3, None])
def test_spm_merges_are_every_cut_into_two_tokens(monkeypatch, short):
    """_spm_merges against its definition, on random vocabularies where tokens begin and end one another,
    with the length between sliced and chained pieces moved so that both ways are used."""
    if short:
        monkeypatch.setattr(tk, "_SHORT_PIECE", short)
    rng = random.Random(short)
    for _ in range(200):
        tokens = ["".join(rng.choice("ab") for _ in range(rng.randint(1, 9))) for _ in range(rng.randint(1, 40))]
        tok2id = {t: i for i, t in enumerate(tokens)}
        order = list(range(len(tokens)))
        rng.shuffle(order)
        want = [(t[:k], t[k:]) for t in (tokens[i] for i in order if tok2id[tokens[i]] == i)
                for k in range(1, len(t)) if t[:k] in tok2id and t[k:] in tok2id]
        assert tk._spm_merges(tokens, order, tok2id) == want


def test_bpe_huge_merge_and_many_merges(bpe_meta, guard):
    huge = "a" * 1_000_000
    t0 = time.monotonic()
    tok = Tokenizer.from_metadata(dict(bpe_meta, **{
        "tokenizer.ggml.merges": [huge + " " + huge] + list(bpe_meta["tokenizer.ggml.merges"]) * 2000}))
    assert time.monotonic() - t0 < 10
    assert tok.encode("hello") == Tokenizer.from_metadata(bpe_meta).encode("hello")
    with pytest.raises(ModelFormatError, match="merges entry") as e:
        Tokenizer.from_metadata(dict(bpe_meta, **{"tokenizer.ggml.merges": [huge]}))
    assert len(str(e.value)) < 200


def test_panics_of_the_tokenizers_library_are_model_format_errors(bpe_meta):
    class PanicException(BaseException):     # pyo3_runtime's, which cannot be imported
        pass

    class Panicking:
        encode_special_tokens = False

        def encode(self, *a, **k):
            raise PanicException("index out of bounds")

    tok = Tokenizer.from_metadata(bpe_meta)
    tok._hf = Panicking()
    with pytest.raises(ModelFormatError, match="panicked: index out of bounds"):
        tok.encode("hi")


# ---------------------------------------------------------------------------------------------------
# Hugging Face tokenizer files


@pytest.fixture(scope="module")
def hf_base(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf_tok")
    write_hf_tokenizer(folder, "tiny", 300)
    return str(folder)


@pytest.fixture
def hf_folder(hf_base, tmp_path):
    """hf_folder(*edits) -> a copy of the tiny tokenizer folder after each edit(path_of)."""
    def make(*edits):
        folder = str(tmp_path / f"tok{len(os.listdir(tmp_path))}")
        shutil.copytree(hf_base, folder)
        for edit in edits:
            edit(lambda name: os.path.join(folder, name))
        return folder
    return make


def json_edit(name, fn):
    def edit(path_of):
        with open(path_of(name), encoding="utf-8") as f:
            data = json.load(f)
        data = fn(data)
        with open(path_of(name), "w", encoding="utf-8") as f:
            json.dump(data, f)
    return edit


def write(name, text):
    def edit(path_of):
        with open(path_of(name), "w", encoding="utf-8") as f:
            f.write(text)
    return edit


def set_key(**kw):
    return lambda d: {**d, **kw}


def vocab_id(text, i):
    def fn(d):
        d["model"]["vocab"][text] = i
        return d
    return fn


def added_token(text, i):
    def fn(d):
        d["added_tokens"].append({"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
                                  "normalized": False, "special": False})
        return d
    return fn


def fifo(name):
    def edit(path_of):
        if os.path.exists(path_of(name)):
            os.remove(path_of(name))
        os.mkfifo(path_of(name))
    return edit


def drop_template(d):
    d.pop("chat_template")
    return d


@pytest.mark.parametrize("edit, words", [
    (json_edit("tokenizer.json", vocab_id("zzzz", 10**8)), "tokenizer.json: token 'zzzz' has id 100000000, past"),
    (json_edit("tokenizer.json", added_token("hi", 5000)), "tokenizer.json: added token 'hi' has id 5000, past .*300"),
    (json_edit("tokenizer.json", vocab_id("a" * 70_000, 299)), "tokenizer.json: the token .* 70000 characters long"),
    (json_edit("tokenizer.json", set_key(normalizer={"type": "Precompiled", "precompiled_charsmap": "!!"})),
     "tokenizer.json: .*panicked"),
    (json_edit("tokenizer.json", lambda d: []), "tokenizer.json: should be a JSON object"),
    (json_edit("tokenizer_config.json", lambda d: 42), "tokenizer_config.json: should be a JSON object, not int"),
    (json_edit("tokenizer_config.json", lambda d: [d]), "tokenizer_config.json: should be a JSON object, not list"),
    (json_edit("tokenizer_config.json", lambda d: "x"), "tokenizer_config.json: should be a JSON object, not str"),
    (write("generation_config.json", "[]"), "generation_config.json: should be a JSON object"),
    (write("tokenizer_config.json", "[" * 100_000 + "]" * 100_000), "tokenizer_config.json: not valid JSON"),
    (json_edit("tokenizer_config.json", set_key(chat_template=5)), "tokenizer_config.json: 'chat_template' should"),
    (json_edit("tokenizer_config.json", set_key(chat_template=["a", 1])), "tokenizer_config.json: 'chat_template'"),
    (json_edit("tokenizer_config.json", set_key(chat_template=[{"name": "default", "template": 5}])),
     "tokenizer_config.json: 'chat_template'"),
    (json_edit("tokenizer_config.json", set_key(add_bos_token="false")), "'add_bos_token' should be true or false"),
])
def test_hf_file_of_the_wrong_shape(hf_folder, guard, edit, words):
    folder = hf_folder(edit)
    with pytest.raises(ModelFormatError, match=words):
        HFTokenizer.from_folder(folder, n_vocab=300)


def test_hf_ids_bounded_by_the_vocabulary_without_n_vocab(hf_folder, guard):
    folder = hf_folder(json_edit("tokenizer.json", vocab_id("zzzz", 10**8)))
    with pytest.raises(ModelFormatError, match="id 100000000, past the 301 entries of the vocabulary"):
        HFTokenizer.from_folder(folder)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
@pytest.mark.parametrize("name, edits", [
    ("tokenizer.json", [fifo("tokenizer.json")]),
    ("chat_template.jinja", [json_edit("tokenizer_config.json", drop_template), fifo("chat_template.jinja")]),
])
def test_hf_fifo_is_refused_not_read(hf_folder, guard, name, edits):
    with pytest.raises(ModelFormatError, match=f"{name}: not a regular file"):
        HFTokenizer.from_folder(hf_folder(*edits), n_vocab=300)


def test_hf_added_tokens_decoder_is_not_read(hf_folder):
    """transformers' copy of tokenizer.json's added tokens: whatever its shape, the tokenizer is the same."""
    bad = hf_folder(json_edit("tokenizer_config.json", set_key(added_tokens_decoder=[1, "x"])))
    text = "<|im_start|>hi"
    assert HFTokenizer.from_folder(bad, n_vocab=300).encode(text) == \
        HFTokenizer.from_folder(hf_folder(), n_vocab=300).encode(text)


def test_hf_template_errors_name_the_file(hf_folder):
    folder = hf_folder(json_edit("tokenizer_config.json", set_key(chat_template="{{ 'a' * 3000000000 }}")))
    tok = HFTokenizer.from_folder(folder, n_vocab=300)
    with pytest.raises(ModelFormatError, match=r"tokenizer_config\.json 'chat_template'\) failed: '\*'"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])
