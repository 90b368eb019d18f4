"""Tokenizers described by GGUF metadata, matching llama.cpp's tokenization.

Two kinds of vocabulary are supported, chosen by ``tokenizer.ggml.model``:

* ``gpt2``: byte-level BPE (GPT-2, Llama 3, Qwen 2, SmolLM, ...): the text is split by the
  pre-tokenizer regexes llama.cpp picks for ``tokenizer.ggml.pre``, each piece is mapped to GPT-2's
  printable byte alphabet and merged by the ranks of ``tokenizer.ggml.merges``.
* ``llama``: SentencePiece (Llama 2, Gemma, Mistral v1, ...): spaces become U+2581, an optional space
  is put in front of each run of text (``tokenizer.ggml.add_space_prefix``), adjacent pieces are merged
  best score first (``tokenizer.ggml.scores``), and characters that are not in the vocabulary fall
  back to their UTF-8 bytes as ``<0xXX>`` tokens.  This is expressed as a Hugging Face BPE model whose
  merge list is derived from the vocabulary and ordered by the score of the merged token.

In both kinds, control (type 3), unknown (type 2) and user-defined (type 4) tokens are recognised
whole where they occur in the text before anything else happens, as llama.cpp does.  Control and
unknown tokens only when ``parse_special`` is true (the default); user-defined tokens always.

Decoding follows llama.cpp's ``token_to_piece``: every token maps to a byte string, the bytes of a
sequence are joined and then decoded as UTF-8.  :class:`StreamDecoder` does the same incrementally and
never emits half of a character.

Only numpy, tokenizers and jinja2 are needed; :func:`read_gguf_metadata` reads the key/value header of
a GGUF file without touching the tensors.
"""
from __future__ import annotations

import codecs
import contextlib
import json
import mmap
import os
import reprlib
import struct
import sys
import threading
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import numpy as np

from ..errors import ModelFormatError, ShaderLMError, UnsupportedError

__all__ = [
    "TOKEN_TYPE_BYTE",
    "TOKEN_TYPE_CONTROL",
    "TOKEN_TYPE_NORMAL",
    "TOKEN_TYPE_UNDEFINED",
    "TOKEN_TYPE_UNKNOWN",
    "TOKEN_TYPE_UNUSED",
    "TOKEN_TYPE_USER_DEFINED",
    "StreamDecoder",
    "Tokenizer",
    "read_gguf_metadata",
]

# llama.cpp's llama_token_type values, as stored in tokenizer.ggml.token_type
TOKEN_TYPE_UNDEFINED = 0
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_UNUSED = 5
TOKEN_TYPE_BYTE = 6

SPACE_MARK = "\u2581"  # SentencePiece's visible space

# What a model file may ask of us; past these it is refused with a ModelFormatError naming the limit.
MAX_TOKEN_CHARS = 1 << 16           # one vocabulary entry: real ones are at most a few hundred characters
MAX_SPM_MERGE_CHARS = 1 << 26       # the text of the merges derived from a SentencePiece vocabulary (Gemma 3's
                                    # 262k tokens give a few million characters)
MAX_CHAT_OUTPUT = 8 << 20           # characters one chat template render may produce, and the size of any
                                    # value it builds by '*', '**', '+' or '~': more text than any context holds
MAX_CHAT_SECONDS = 2.0              # real templates render in about a millisecond

# --------------------------------------------------------------------------------------------------
# GGUF header reader (metadata only)

_GGUF_MAGIC = b"GGUF"
# value type -> (struct code, numpy dtype) for the fixed-size types
_GGUF_SCALARS = {
    0: ("B", np.uint8), 1: ("b", np.int8), 2: ("H", np.uint16), 3: ("h", np.int16),
    4: ("I", np.uint32), 5: ("i", np.int32), 6: ("f", np.float32), 7: ("?", np.bool_),
    10: ("Q", np.uint64), 11: ("q", np.int64), 12: ("d", np.float64),
}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def read_gguf_metadata(path: str | os.PathLike,
                       prefixes: Sequence[str] | None = ("tokenizer.", "general.")) -> dict[str, Any]:
    """The key/value metadata of a GGUF file, as Python values.

    Only keys starting with one of ``prefixes`` are returned (all keys when ``prefixes`` is None).
    Strings are ``str``, numbers ``int``/``float``/``bool``, arrays of numbers numpy arrays and arrays
    of strings lists of ``str``.  Tensor data is not read.  Raises ModelFormatError for a file that
    is not GGUF or is truncated.
    """
    path = os.fspath(path)
    try:
        f = open(path, "rb")
    except OSError as e:
        raise ModelFormatError(f"{path}: cannot open: {e.strerror}") from e
    with f:
        size = os.fstat(f.fileno()).st_size
        if size < 24:
            raise ModelFormatError(f"{path}: file is too small to be GGUF ({size} bytes)")
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            return _parse_gguf_kv(buf, path, tuple(prefixes) if prefixes is not None else None)
        finally:
            buf.close()


def _parse_gguf_kv(buf, path: str, prefixes: tuple[str, ...] | None) -> dict[str, Any]:
    if buf[:4] != _GGUF_MAGIC:
        raise ModelFormatError(f"{path}: not a GGUF file (magic {bytes(buf[:4])!r})")
    end = "<"
    (version,) = struct.unpack_from("<I", buf, 4)
    if version & 0xFFFF == 0 and version != 0:  # written big-endian
        end = ">"
        (version,) = struct.unpack_from(">I", buf, 4)
    if version not in (2, 3):
        raise UnsupportedError(f"{path}: GGUF version {version} is not supported (only 2 and 3)")
    n_kv = struct.unpack_from(end + "Q", buf, 16)[0]
    pos = 24
    n = len(buf)
    out: dict[str, Any] = {}
    u64 = struct.Struct(end + "Q")
    u32 = struct.Struct(end + "I")

    def need(p: int, k: int, what: str) -> None:
        if p + k > n:
            raise ModelFormatError(f"{path}: truncated while reading {what} at offset {p}")

    def read_str(p: int, what: str) -> tuple[str, int]:
        need(p, 8, what)
        (ln,) = u64.unpack_from(buf, p)
        p += 8
        need(p, ln, what)
        return bytes(buf[p:p + ln]).decode("utf-8", errors="replace"), p + ln

    for _ in range(n_kv):
        key, pos = read_str(pos, "a metadata key")
        need(pos, 4, f"the type of {key!r}")
        (vtype,) = u32.unpack_from(buf, pos)
        pos += 4
        want = prefixes is None or key.startswith(prefixes) or key == "general.architecture"
        if vtype in _GGUF_SCALARS:
            code, _ = _GGUF_SCALARS[vtype]
            k = struct.calcsize(code)
            need(pos, k, f"the value of {key!r}")
            val = struct.unpack_from(end + code, buf, pos)[0]
            pos += k
        elif vtype == _GGUF_STRING:
            val, pos = read_str(pos, f"the value of {key!r}")
        elif vtype == _GGUF_ARRAY:
            need(pos, 12, f"the array header of {key!r}")
            (atype,) = u32.unpack_from(buf, pos)
            (count,) = u64.unpack_from(buf, pos + 4)
            pos += 12
            if atype in _GGUF_SCALARS:
                _, dt = _GGUF_SCALARS[atype]
                dt = np.dtype(dt).newbyteorder(end)
                nbytes = count * dt.itemsize
                need(pos, nbytes, f"the array {key!r}")
                val = np.frombuffer(buf, dtype=dt, count=count, offset=pos).astype(dt.newbyteorder("="))
                pos += nbytes
            elif atype == _GGUF_STRING:
                items = []
                append = items.append
                for _i in range(count):
                    if pos + 8 > n:
                        need(pos, 8, f"the array {key!r}")
                    (ln,) = u64.unpack_from(buf, pos)
                    pos += 8
                    if pos + ln > n:
                        need(pos, ln, f"the array {key!r}")
                    append(buf[pos:pos + ln].decode("utf-8", errors="replace") if want else None)
                    pos += ln
                val = items
            else:
                raise ModelFormatError(f"{path}: metadata array {key!r} has unsupported element type {atype}")
        else:
            raise ModelFormatError(f"{path}: metadata key {key!r} has unknown value type {vtype}")
        if want:
            out[key] = val
    return out


# --------------------------------------------------------------------------------------------------
# metadata helpers


def _wrong_type(key: str, want: str, v: Any) -> ModelFormatError:
    return ModelFormatError(f"tokenizer metadata key {key!r} should be {want}, got {reprlib.repr(v)}")


def _as_int(meta: Mapping[str, Any], key: str) -> int | None:
    v = meta.get(key)
    if v is None:
        return None
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return int(v)
    raise _wrong_type(key, "an integer", v)


def _as_str(meta: Mapping[str, Any], key: str) -> str | None:
    v = meta.get(key)
    if v is None or isinstance(v, str):
        return v
    raise _wrong_type(key, "a string", v)


def _as_strings(meta: Mapping[str, Any], key: str) -> list[str] | None:
    v = meta.get(key)
    if v is None:
        return None
    if isinstance(v, np.ndarray) and v.dtype.kind in "USO":
        v = v.tolist()
    if isinstance(v, (list, tuple)) and all(isinstance(x, (str, bytes, bytearray)) for x in v):
        return [x if isinstance(x, str) else bytes(x).decode("utf-8", errors="replace") for x in v]
    raise _wrong_type(key, "an array of strings", v)


def _as_numbers(meta: Mapping[str, Any], key: str, n: int, kinds: str, what: str) -> np.ndarray | None:
    """Array ``key`` as numpy: one number per token, of a numpy kind in ``kinds``."""
    v = meta.get(key)
    if v is None:
        return None
    try:
        a = np.asarray(v) if isinstance(v, (np.ndarray, list, tuple)) else None
    except ValueError:                  # ragged nested lists
        a = None
    if a is None or a.ndim != 1 or (len(a) and a.dtype.kind not in kinds):
        raise _wrong_type(key, f"an array of {what}", v)
    if len(a) != n:
        raise ModelFormatError(f"tokenizer metadata key {key!r} has {len(a)} entries for {n} tokens")
    return a


def _as_bool(meta: Mapping[str, Any], key: str, default: bool) -> bool:
    v = meta.get(key)
    if v is None:
        return default
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return bool(int(v))
    if isinstance(v, str) and v.lower() in ("true", "false", "1", "0"):
        return v.lower() in ("true", "1")
    raise _wrong_type(key, "a boolean", v)


def _check_token_lengths(texts: Sequence[str], where: str) -> None:
    longest = max(texts, key=len, default="")
    if len(longest) > MAX_TOKEN_CHARS:
        raise ModelFormatError(f"{where}: the token {reprlib.repr(longest)} is {len(longest)} characters long "
                               f"(at most {MAX_TOKEN_CHARS})")


_SHORT_PIECE = 64     # pieces up to this long are looked up by slicing; longer ones (rare) through _longest_prefix


def _spm_merges(tokens: Sequence[str], order: Iterable[int], tok2id: Mapping[str, int]) -> list[tuple[str, str]]:
    """Every way of cutting a token into two tokens, as (left, right): tokens in ``order`` (those whose
    text maps to their id), cuts left to right.  Linear in the vocabulary's characters: a piece is
    sliced out of a token only when it is short, and longer ones come from chains of tokens that begin
    (end) one another, so that one very long token costs no more than its length."""
    long = [t for t in tok2id if len(t) > _SHORT_PIECE]
    long_slot = {t: j for j, t in enumerate(long)}
    heads = _longest_prefix(long)
    tails = _longest_prefix([t[::-1] for t in long])
    get = tok2id.get
    merges: list[tuple[str, str]] = []
    append = merges.append
    size = 0
    for i in order:
        t = tokens[i]
        n = len(t)
        if n < 2 or get(t) != i:
            continue
        if n <= _SHORT_PIECE:
            for k in range(1, n):
                a = t[:k]
                if a in tok2id:
                    b = t[k:]
                    if b in tok2id:
                        append((a, b))
                        size += n
        else:
            j = long_slot[t]
            cuts = [(k, t[:k]) for k in range(1, _SHORT_PIECE + 1) if t[:k] in tok2id]
            longer, p = [], heads[j]
            while p >= 0:
                longer.append((len(long[p]), long[p]))
                p = heads[p]
            cuts += reversed(longer)
            long_tails, q = {}, tails[j]
            while q >= 0:
                long_tails[len(long[q])] = long[q]
                q = tails[q]
            for k, a in cuts:
                b = t[k:] if n - k <= _SHORT_PIECE else long_tails.get(n - k)
                if b is not None and b in tok2id:
                    append((a, b))
                    size += n
        if size > MAX_SPM_MERGE_CHARS:
            raise ModelFormatError(f"tokenizer.ggml.tokens: the SentencePiece merges of this vocabulary (every way "
                                   f"to cut a token into two tokens) exceed {MAX_SPM_MERGE_CHARS} characters")
    return merges


def _longest_prefix(texts: Sequence[str]) -> list[int]:
    """For each of the distinct ``texts``, the index of the longest other text that begins it (-1: none).

    In sorted order, the texts that begin a text come before it, each beginning the next: a stack walk
    finds them in time linear in the texts' length (after the sort)."""
    found = [-1] * len(texts)
    stack: list[int] = []
    for i in sorted(range(len(texts)), key=texts.__getitem__):
        t = texts[i]
        while stack and not t.startswith(texts[stack[-1]]):
            stack.pop()
        if stack:
            found[i] = stack[-1]
        stack.append(i)
    return found


def _is_panic(e: BaseException) -> bool:
    """A Rust panic in the tokenizers library: pyo3's PanicException, a BaseException not importable by name."""
    return type(e).__name__ == "PanicException"


def _one_line(e: BaseException, limit: int = 300) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[:limit] + "..."


@contextlib.contextmanager
def _library_errors(where: str):
    """The tokenizers library's failures on a file's data (its errors, its panics) as one ModelFormatError.
    Used while a model loads: a panic's report, which Rust writes to stderr itself, is held back."""
    with _stderr_held() as panicked:
        try:
            yield
        except ShaderLMError:
            raise
        except BaseException as e:
            if not (isinstance(e, Exception) or _is_panic(e)):
                raise
            panicked.append(_is_panic(e))
            what = "the tokenizers library panicked" if _is_panic(e) else "the tokenizers library refused it"
            raise ModelFormatError(f"{where}: {what}: {_one_line(e)}") from None


@contextlib.contextmanager
def _stderr_held():
    """File descriptor 2 into a temporary file while native code runs; what was written there is passed
    on afterwards unless the caller appended True to the yielded list (a panic, reported otherwise)."""
    import tempfile
    panicked: list = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield panicked
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if not any(panicked):
                held.seek(0)
                text = held.read()
                if text:
                    os.write(2, text)


# --------------------------------------------------------------------------------------------------
# byte-level BPE pieces

def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from each byte to a printable character (the alphabet of byte-level vocabularies)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(0x100 + extra)
            extra += 1
    return table


_BYTE_TO_CHAR = _bytes_to_unicode()
_CHAR_TO_BYTE = {c: b for b, c in _BYTE_TO_CHAR.items()}

# The split expressions llama.cpp (src/llama-vocab.cpp) uses per tokenizer.ggml.pre.  Each expression
# is applied in turn to every piece left by the previous one; matches and the text between them both
# become pieces ("isolated" splitting).
_CONTRACTIONS_CI = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (_CONTRACTIONS_CI + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (_CONTRACTIONS_CI + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# OpenAI's o200k split (gpt-oss, GPT-4o): letter runs break at case changes, digits in threes
_GPT4O = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+" + _CONTRACTIONS_CI + "?"
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _CONTRACTIONS_CI + "?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEEPSEEK_LLM = [  # letters: llama.cpp's explicit ranges (escaped so that no editor normalises them)
    "[\r\n]",
    ("\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f"
    "\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d"
    "\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
    "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a"
    "\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
    "\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+"),
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    "\\s+\\z",  # std::regex's "$": the end of the piece only
    "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
    "\\p{N}+",
]
_DEFAULT_BPE = [r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"]

# name -> (regex list, ignore_merges, default add_bos)
_PRE_TOKENIZERS: dict[str, tuple[list[str], bool, bool]] = {}
for _names, _spec in [
    (("default",), (_DEFAULT_BPE, False, False)),
    (("gpt2", "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "mpt", "olmo",
      "jais", "exaone4", "a.x-4.0", "mellum", "trillion", "granite-docling", "roberta-bpe", "jina-v1-en",
      "jina-v2-code"),
     ([_GPT2], False, False)),
    (("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"),
     ([r"\p{N}", _GPT2], False, False)),
    (("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"),
     ([_LLAMA3], True, True)),
    (("dbrx", "smaug-bpe"), ([_LLAMA3], False, False)),
    (("qwen2", "deepseek-r1-qwen", "megrez", "stablelm2", "hunyuan"), ([_QWEN2], False, False)),
    (("deepseek-llm",), (_DEEPSEEK_LLM, False, False)),
    (("gpt-4o",), ([_GPT4O], False, False)),
]:
    for _n in _names:
        _PRE_TOKENIZERS[_n] = _spec

# Texts of tokens that end a turn or the generation (llama.cpp's list), when they are control tokens.
_EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
              "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
              "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
              "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[")

_CHATML_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


# --------------------------------------------------------------------------------------------------
# chat templates

class _TemplateLimit(Exception):
    """A chat template went past MAX_CHAT_OUTPUT or MAX_CHAT_SECONDS."""


class _RenderState(threading.local):
    deadline = float("inf")       # of the render running in this thread


_RENDER = _RenderState()


def _check_time() -> None:
    if time.monotonic() > _RENDER.deadline:
        raise _TemplateLimit(f"it ran for more than {MAX_CHAT_SECONDS:g} s")


def _timed_loop(iterable):
    """What every ``{% for %}`` of a chat template iterates: ``iterable``, with the clock read at each step."""
    for item in iterable:
        _check_time()
        yield item


def _sized(text: str) -> str:
    """What every '~' of a chat template makes, refused past MAX_CHAT_OUTPUT characters (so that no loop
    doubles a string up to the time limit)."""
    if len(text) > MAX_CHAT_OUTPUT:
        raise _TemplateLimit(f"'~' made a string of {len(text)} characters (at most {MAX_CHAT_OUTPUT})")
    return text


def _binop_size(op: str, a: Any, b: Any) -> int:
    """About how large ``a op b`` would be: items of a string or list, bytes of an integer (0: small, or
    for the operator itself to refuse)."""
    seq = (str, list, tuple)
    if op == "+":
        return len(a) + len(b) if isinstance(a, seq) and isinstance(b, seq) else 0
    if isinstance(a, int) and isinstance(b, int):
        if op == "**":
            return (abs(a).bit_length() - 1) * b // 8
        return (a.bit_length() + b.bit_length()) // 8
    if isinstance(a, seq) and isinstance(b, int):
        return len(a) * b
    if isinstance(b, seq) and isinstance(a, int):
        return len(b) * a
    return 0


def _chat_environment():
    """The sandboxed jinja2 environment chat templates run in, with transformers' helpers.

    Limits: '*', '**', '+' and '~' refuse to build a value larger than MAX_CHAT_OUTPUT; the clock is read
    at each step of every loop and at each call (macros, methods, recursive loops), which is where a
    template can spend unbounded time; the output is counted as it is generated (Tokenizer._render).
    No thread or signal: a thread cannot be stopped from outside, a signal only reaches the main one,
    and a trace function would slow every render several times."""
    import jinja2
    from jinja2 import nodes
    from jinja2.compiler import CodeGenerator
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.visitor import NodeTransformer

    def through(node, name):
        return nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)

    class Limits(NodeTransformer):
        def visit_For(self, node):
            node = self.generic_visit(node)
            node.iter = through(node.iter, "_timed_loop")
            return node

        def visit_Concat(self, node):
            return through(self.generic_visit(node), "_sized")

    class ChatCodeGenerator(CodeGenerator):
        def visit_Template(self, node, frame=None):
            Limits().visit(node)     # before the base class collects the filters used
            super().visit_Template(node, frame)

    class ChatEnvironment(ImmutableSandboxedEnvironment):
        code_generator_class = ChatCodeGenerator
        intercepted_binops = frozenset(("*", "**", "+"))

        def call(__self, __context, __obj, *args, **kwargs):  # the base's names: no keyword of a template's
            _check_time()
            return super().call(__context, __obj, *args, **kwargs)

        def call_binop(self, context, operator, left, right):
            size = _binop_size(operator, left, right)
            if size > MAX_CHAT_OUTPUT:
                raise _TemplateLimit(f"'{operator}' would make a value of about {size} items or bytes "
                                     f"(at most {MAX_CHAT_OUTPUT})")
            return self.binop_table[operator](left, right)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ChatEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols], keep_trailing_newline=False)
    env.filters["tojson"] = tojson
    env.filters["_timed_loop"] = _timed_loop
    env.filters["_sized"] = _sized
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def _template_problem(e: BaseException) -> str:
    """One line saying what went wrong in a chat template."""
    import jinja2

    if isinstance(e, jinja2.TemplateSyntaxError):
        return f"syntax error on line {e.lineno}: {_one_line(e.message or '')}"
    if type(e) in (jinja2.TemplateError, _TemplateLimit):    # raise_exception's message, or a limit
        return _one_line(e)
    text = _one_line(e)
    return type(e).__name__ if text == type(e).__name__ else f"{type(e).__name__}: {text}"


class Tokenizer:
    """A GGUF tokenizer: text <-> token ids, special tokens, chat template.

    Build one with :meth:`from_metadata` (GGUF key -> value mapping) or :meth:`from_gguf` (a path).
    """

    def __init__(self) -> None:  # use from_metadata / from_gguf
        self.kind: str = ""
        self.pre: str | None = None
        self.arch: str | None = None
        self.fallback_template: str | None = None    # the architecture's chat format, where the file has none
        self.tokens: list[str] = []
        self.token_types: list[int] = []
        self.scores: np.ndarray | None = None
        self.vocab_size: int = 0
        self.bos_id: int | None = None
        self.eos_id: int | None = None
        self.eot_id: int | None = None
        self.unk_id: int | None = None
        self.pad_id: int | None = None
        self.add_bos: bool = False
        self.add_eos: bool = False
        self.add_space_prefix: bool = False
        self.eos_ids: set[int] = set()
        self.chat_template: str | None = None
        self.chat_template_source = "tokenizer.chat_template"  # where chat_template comes from, for errors
        self._hf = None
        self._token_to_id: dict[str, int] = {}
        self._pieces: list[bytes | None] = []
        self._chat_env = None
        self._chat_templates: dict[str, Any] = {}     # source -> compiled template

    def __getstate__(self):
        # the compiled chat templates are a cache that does not pickle: a copy (another process) compiles its own
        return {**self.__dict__, "_chat_env": None, "_chat_templates": {}}

    # ---- construction --------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, path: str | os.PathLike) -> Tokenizer:
        """Read the tokenizer keys of a GGUF file and build the tokenizer."""
        meta = read_gguf_metadata(path)
        try:
            return cls.from_metadata(meta)
        except (ModelFormatError, UnsupportedError) as e:
            raise type(e)(f"{os.fspath(path)}: {e}") from None

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> Tokenizer:
        """Build from GGUF metadata (``tokenizer.ggml.*`` keys, ``tokenizer.chat_template``,
        ``general.architecture``)."""
        self = cls()
        model = _as_str(meta, "tokenizer.ggml.model")
        if model is None:
            raise ModelFormatError("missing tokenizer metadata key 'tokenizer.ggml.model'")
        if model not in ("gpt2", "llama"):
            raise UnsupportedError(f"tokenizer.ggml.model = {model!r} is not supported "
                                   f"(supported: 'gpt2' byte-level BPE, 'llama' SentencePiece)")
        self.kind = model
        self.arch = _as_str(meta, "general.architecture")
        tokens = _as_strings(meta, "tokenizer.ggml.tokens")
        if tokens is None:
            raise ModelFormatError("missing tokenizer metadata key 'tokenizer.ggml.tokens'")
        if not tokens:
            raise ModelFormatError("tokenizer metadata key 'tokenizer.ggml.tokens' is empty")
        _check_token_lengths(tokens, "tokenizer.ggml.tokens")
        n = len(tokens)
        # llama.cpp renames empty tokens so that every text maps to one id
        tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        self.tokens = tokens
        self.vocab_size = n

        types = _as_numbers(meta, "tokenizer.ggml.token_type", n, "iu", "integers")
        self.token_types = [TOKEN_TYPE_NORMAL] * n if types is None else types.tolist()
        scores = _as_numbers(meta, "tokenizer.ggml.scores", n, "iuf", "numbers")
        if scores is not None:
            self.scores = scores.astype(np.float32)

        def tok_id(key: str, default: int | None) -> int | None:
            v = _as_int(meta, key)
            if v is not None and v < 0:            # the key is unsigned in GGUF: a negative one is malformed
                raise ModelFormatError(f"tokenizer metadata key {key!r} = {v} is outside the vocabulary "
                                       f"of {n} tokens")
            if v is not None and v >= n:           # llama.cpp warns and keeps the default (real files have these)
                warnings.warn(f"{key} = {v} is outside the vocabulary of {n} tokens; ignoring it", stacklevel=3)
                v = None
            return default if v is None and default is not None and default < n else v

        spm = model == "llama"
        self.bos_id = tok_id("tokenizer.ggml.bos_token_id", 1 if spm else None)
        self.eos_id = tok_id("tokenizer.ggml.eos_token_id", 2 if spm else None)
        self.unk_id = tok_id("tokenizer.ggml.unknown_token_id", 0 if spm else None)
        self.eot_id = tok_id("tokenizer.ggml.eot_token_id", None)
        eom_id = tok_id("tokenizer.ggml.eom_token_id", None)
        self.pad_id = tok_id("tokenizer.ggml.padding_token_id", None)

        tok2id: dict[str, int] = {}
        for i, t in enumerate(tokens):
            tok2id[t] = i  # a later duplicate wins, as in llama.cpp
        self._token_to_id = tok2id

        # llama.cpp treats every token named like an end-of-generation marker as a control token, whatever
        # its type in the file (so Gemma 3's user-defined "</s>" too), except "</s>" in vocabularies that
        # have another end marker for tool responses (Gemma 4, PLaMo).
        plain_s = "<|tool_response>" in tok2id or "<|plamo:eos|>" in tok2id
        for text in _EOG_TEXTS:
            i = tok2id.get(text)
            if i is not None and self.token_types[i] != TOKEN_TYPE_CONTROL and not (text == "</s>" and plain_s):
                self.token_types[i] = TOKEN_TYPE_CONTROL

        if spm:
            self.pre = None
            self.add_space_prefix = _as_bool(meta, "tokenizer.ggml.add_space_prefix", True)
            default_bos = True
            self._hf = self._build_spm(tokens, self.token_types, self.scores, tok2id)
        else:
            pre = _as_str(meta, "tokenizer.ggml.pre")
            if not pre:
                warnings.warn("GGUF has no 'tokenizer.ggml.pre': using llama.cpp's 'default' pre-tokenizer",
                              stacklevel=2)
                pre = "default"
            spec = _PRE_TOKENIZERS.get(pre)
            if spec is None:
                warnings.warn(f"tokenizer.ggml.pre = {pre!r} is not known to shaderlm: splitting text with "
                              f"GPT-2's regex, which may give different tokens than the model was trained on",
                              stacklevel=2)
                spec = _PRE_TOKENIZERS["gpt2"]
            self.pre = pre
            self.add_space_prefix = False
            regexes, ignore_merges, default_bos = spec
            merges = _as_strings(meta, "tokenizer.ggml.merges")
            if merges is None:
                raise ModelFormatError("missing tokenizer metadata key 'tokenizer.ggml.merges' "
                                       "(required for tokenizer.ggml.model = 'gpt2')")
            self._hf = self._build_bpe(tokens, tok2id, merges, regexes, ignore_merges)

        self.add_bos = _as_bool(meta, "tokenizer.ggml.add_bos_token", default_bos)
        self.add_eos = _as_bool(meta, "tokenizer.ggml.add_eos_token", False)
        if self.add_bos and self.bos_id is None:
            raise ModelFormatError("tokenizer adds a BOS token but 'tokenizer.ggml.bos_token_id' is missing")
        self._add_special_tokens()

        eos = set()
        for text in _EOG_TEXTS:
            i = tok2id.get(text)
            if i is not None and self.token_types[i] == TOKEN_TYPE_CONTROL:
                eos.add(i)
        # gpt-oss / Solar Open: "<|end|>" ends a message, not the generation (llama.cpp's rule)
        end = tok2id.get("<|end|>")
        if end in eos and (("<|return|>" in tok2id and "<|call|>" in tok2id)
                           or ("<|calls|>" in tok2id and "<|flush|>" in tok2id)):
            eos.discard(end)
        for i in (self.eos_id, self.eot_id, eom_id):
            if i is not None:
                eos.add(i)
        self.eos_ids = eos

        self.chat_template = _as_str(meta, "tokenizer.chat_template") or None
        self._pieces = [None] * n
        return self

    def _build_bpe(self, tokens, tok2id, merges, regexes, ignore_merges):
        from tokenizers import Regex, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer

        pairs = []
        for m in merges:
            a, sep, b = m.partition(" ")
            if not sep:
                raise ModelFormatError(f"tokenizer.ggml.merges entry {reprlib.repr(m)} is not two tokens "
                                       f"separated by a space")
            if a in tok2id and b in tok2id and (a + b) in tok2id:
                pairs.append((a, b))
        with _library_errors("tokenizer.ggml.tokens"):
            hf = HFTokenizer(models.BPE(vocab=tok2id, merges=pairs, ignore_merges=ignore_merges, byte_fallback=False))
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        hf.decoder = decoders.ByteLevel()
        return hf

    def _build_spm(self, tokens, types, scores, tok2id):
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, normalizers

        n = len(tokens)
        sc = scores if scores is not None else np.zeros(n, dtype=np.float32)
        # llama.cpp merges two adjacent pieces whenever their concatenation is a token, highest score of
        # that token first.  Every way of cutting a token into two tokens is therefore a merge, ranked by
        # the score of the token it makes (ties: lower id first).
        order = np.lexsort((np.arange(n), -sc.astype(np.float64)))
        merges = _spm_merges(tokens, order.tolist(), tok2id)
        unk = None
        if self.unk_id is not None:
            unk = tokens[self.unk_id]
        with _library_errors("tokenizer.ggml.tokens"):
            hf = HFTokenizer(models.BPE(vocab=tok2id, merges=merges, unk_token=unk, byte_fallback=True,
                                        fuse_unk=False))
        norm = [normalizers.Replace(" ", SPACE_MARK)]
        if self.add_space_prefix:
            norm.insert(0, normalizers.Prepend(" "))
        hf.normalizer = normalizers.Sequence(norm)
        hf.pre_tokenizer = None
        hf.decoder = decoders.Sequence([decoders.Replace(SPACE_MARK, " "), decoders.ByteFallback(), decoders.Fuse()])
        return hf

    def _add_special_tokens(self) -> None:
        from tokenizers import AddedToken

        special, user = [], []
        types = np.asarray(self.token_types)
        wanted = np.isin(types, (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_USER_DEFINED))
        for i in np.nonzero(wanted)[0].tolist():
            t, ty = self.tokens[i], self.token_types[i]
            if self._token_to_id.get(t) != i:
                continue
            if ty in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN):
                special.append(AddedToken(t, special=True, normalized=False))
            elif ty == TOKEN_TYPE_USER_DEFINED:
                user.append(AddedToken(t, special=False, normalized=False))
        with _library_errors("tokenizer.ggml.tokens"):
            if special:
                self._hf.add_special_tokens(special)
            if user:
                self._hf.add_tokens(user)

    # ---- vocabulary ----------------------------------------------------------------------------
    def token_to_id(self, text: str) -> int | None:
        return self._token_to_id.get(text)

    def id_to_token(self, token_id: int) -> str:
        return self.tokens[token_id]

    def is_special(self, token_id: int) -> bool:
        """Control or unknown token (left out of decoded text when ``skip_special``)."""
        return self.token_types[token_id] in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN)

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.eos_ids

    @property
    def bos_token(self) -> str | None:
        return self.tokens[self.bos_id] if self.bos_id is not None else None

    @property
    def eos_token(self) -> str | None:
        return self.tokens[self.eos_id] if self.eos_id is not None else None

    def token_to_bytes(self, token_id: int) -> bytes:
        """The bytes token ``token_id`` stands for (llama.cpp's token_to_piece with special=True)."""
        p = self._pieces[token_id]
        if p is None:
            p = self._piece(token_id)
            self._pieces[token_id] = p
        return p

    def _piece(self, i: int) -> bytes:
        t = self.tokens[i]
        ty = self.token_types[i]
        if ty in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_USER_DEFINED):
            return t.encode("utf-8")
        if ty == TOKEN_TYPE_BYTE:
            try:
                return bytes([int(t[3:-1], 16)]) if t.startswith("<0x") and t.endswith(">") else t.encode("utf-8")
            except ValueError:
                return t.encode("utf-8")
        if ty != TOKEN_TYPE_NORMAL:
            return b""  # unused / undefined: llama.cpp renders nothing
        if self.kind == "llama":
            return t.replace(SPACE_MARK, " ").encode("utf-8")
        c2b = _CHAR_TO_BYTE
        out = bytearray()
        for ch in t:
            b = c2b.get(ch)
            if b is None:
                out += ch.encode("utf-8")
            else:
                out.append(b)
        return bytes(out)

    # ---- encode / decode -----------------------------------------------------------------------
    def encode(self, text: str, add_bos: bool | None = None, add_eos: bool | None = None,
               parse_special: bool = True) -> list[int]:
        """Token ids for ``text``.

        add_bos / add_eos: None follows the GGUF (``tokenizer.ggml.add_bos_token`` /
        ``add_eos_token``).  parse_special: recognise control tokens such as ``<|im_start|>`` written in
        the text (user-defined tokens are always recognised, as in llama.cpp).
        """
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, got {type(text).__name__}")
        hf = self._hf
        if hf.encode_special_tokens == parse_special:
            hf.encode_special_tokens = not parse_special
        try:
            ids = hf.encode(text, add_special_tokens=False).ids if text else []
        except BaseException as e:
            if not _is_panic(e):
                raise
            raise ModelFormatError(f"the tokenizer failed while encoding (the tokenizers library panicked: "
                                   f"{_one_line(e)})") from None
        if self.add_bos if add_bos is None else add_bos:
            if self.bos_id is None:
                raise ModelFormatError("cannot add BOS: 'tokenizer.ggml.bos_token_id' is missing")
            ids.insert(0, self.bos_id)
        if self.add_eos if add_eos is None else add_eos:
            if self.eos_id is None:
                raise ModelFormatError("cannot add EOS: 'tokenizer.ggml.eos_token_id' is missing")
            ids.append(self.eos_id)
        return ids

    def encode_batch(self, texts: Iterable[str], **kw) -> list[list[int]]:
        return [self.encode(t, **kw) for t in texts]

    def decode_bytes(self, ids: Iterable[int], skip_special: bool = False) -> bytes:
        """The bytes of ``ids`` joined (see :meth:`decode`)."""
        out = bytearray()
        strip = self.add_space_prefix
        n = self.vocab_size
        for i in ids:
            i = int(i)
            if not 0 <= i < n:
                raise ValueError(f"token id {i} is outside the vocabulary (0..{n - 1})")
            if skip_special and self.token_types[i] in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN):
                continue
            p = self.token_to_bytes(i)
            if strip and p:
                if p[:1] == b" ":
                    p = p[1:]
                strip = False
            out += p
        return bytes(out)

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text for ``ids``: the tokens' bytes joined and decoded as UTF-8 (invalid bytes become U+FFFD).

        skip_special leaves out control tokens (BOS, ``<|im_end|>``...).  With
        ``add_space_prefix`` (SentencePiece), the space the encoder put before the text is removed from
        the first piece of text.
        """
        return self.decode_bytes(ids, skip_special).decode("utf-8", errors="replace")

    # ---- chat ----------------------------------------------------------------------------------
    def default_chat_template(self) -> str:
        """The template used when the model has no ``tokenizer.chat_template``: its architecture's
        (``fallback_template``, set by the loader), else ChatML, as in llama.cpp."""
        return self.fallback_template or _CHATML_TEMPLATE

    def _environment(self):
        if self._chat_env is None:
            self._chat_env = _chat_environment()
        return self._chat_env

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                            template: str | None = None, **kwargs: Any) -> str:
        """Render ``messages`` (dicts with "role" and "content") with the chat template (jinja2, sandboxed,
        as Hugging Face transformers renders it).  ``template`` overrides the GGUF's; without either a
        built-in one is used (default_chat_template).  Extra keyword
        arguments (tools, ...) are passed to the template.

        Whatever goes wrong in the template (its errors, its exceptions, going past MAX_CHAT_OUTPUT
        characters or MAX_CHAT_SECONDS) is one ModelFormatError naming the template."""
        if template:
            src, where = template, "the template passed in"
        elif self.chat_template:
            src, where = self.chat_template, self.chat_template_source
        else:
            src, where = self.default_chat_template(), "the built-in chat template"
        variables = dict(messages=list(messages), add_generation_prompt=add_generation_prompt,
                         bos_token=self.bos_token or "", eos_token=self.eos_token or "", **kwargs)
        try:
            return self._render(src, variables)
        except Exception as e:
            raise ModelFormatError(f"chat template ({where}) failed: {_template_problem(e)}") from e

    def check_chat_template(self) -> None:
        """Compile the model's chat template now, so that a broken one is reported when the model loads."""
        if self.chat_template:
            try:
                self._compiled(self.chat_template)
            except Exception as e:
                raise ModelFormatError(f"chat template ({self.chat_template_source}) failed: "
                                       f"{_template_problem(e)}") from e

    def _compiled(self, src: str):
        compiled = self._chat_templates.get(src)
        if compiled is None:
            if len(self._chat_templates) >= 8:
                self._chat_templates.clear()
            compiled = self._chat_templates[src] = self._environment().from_string(src)
        return compiled

    def _render(self, src: str, variables: dict[str, Any]) -> str:
        """``src`` compiled (cached) and rendered, stopped past MAX_CHAT_OUTPUT characters or MAX_CHAT_SECONDS."""
        compiled = self._compiled(src)
        out, size = [], 0
        outer = _RENDER.deadline
        _RENDER.deadline = time.monotonic() + MAX_CHAT_SECONDS
        try:
            for chunk in compiled.generate(variables):
                size += len(chunk)
                if size > MAX_CHAT_OUTPUT:
                    raise _TemplateLimit(f"its output is longer than {MAX_CHAT_OUTPUT} characters")
                out.append(chunk)
        finally:
            _RENDER.deadline = outer
        return "".join(out)

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                    template: str | None = None, **kwargs: Any) -> list[int]:
        """Token ids of the rendered chat prompt, with exactly one BOS when the model wants one: if the
        template already wrote the BOS text, no second BOS is added."""
        text = self.apply_chat_template(messages, add_generation_prompt, template=template, **kwargs)
        bos_text = self.bos_token
        add_bos = self.add_bos and not (bos_text and text.startswith(bos_text))
        return self.encode(text, add_bos=add_bos, parse_special=True)

    def __repr__(self) -> str:
        return (f"Tokenizer(kind={self.kind!r}, pre={self.pre!r}, vocab_size={self.vocab_size}, "
                f"bos_id={self.bos_id}, eos_ids={sorted(self.eos_ids)}, add_bos={self.add_bos})")


class StreamDecoder:
    """Turns token ids into text one token at a time.

    ``push(id)`` returns the text completed by that token (possibly "" while a multi-byte character
    is still incomplete); ``flush()`` returns whatever is left (an incomplete tail as U+FFFD).  The
    concatenation of all pushes and the flush equals ``tokenizer.decode(ids)``.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._strip = tokenizer.add_space_prefix

    def push(self, token_id: int) -> str:
        tok = self.tokenizer
        token_id = int(token_id)
        if not 0 <= token_id < tok.vocab_size:
            raise ValueError(f"token id {token_id} is outside the vocabulary (0..{tok.vocab_size - 1})")
        if self.skip_special and tok.token_types[token_id] in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN):
            return ""
        p = tok.token_to_bytes(token_id)
        if self._strip and p:
            if p[:1] == b" ":
                p = p[1:]
            self._strip = False
        return self._decoder.decode(p, final=False)

    def flush(self) -> str:
        out = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return out

    def reset(self) -> None:
        self._decoder.reset()
        self._strip = self.tokenizer.add_space_prefix
