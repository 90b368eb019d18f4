"""The tokenizer of a Hugging Face folder: tokenizer.json (run by the `tokenizers` library, the same code
transformers' fast tokenizers run), special tokens and the chat template from tokenizer_config.json
(or chat_template.jinja), end-of-generation ids from config.json / generation_config.json.

:class:`HFTokenizer` has the interface of the GGUF :class:`~shaderlm.formats.tokenizer.Tokenizer`
(encode, decode, token_to_bytes, eos_ids, chat templates), so the generator and StreamDecoder use
either.  BOS/EOS follow what the tokenizer.json post-processor adds (transformers' default
``add_special_tokens=True``), unless tokenizer_config.json says ``add_bos_token`` / ``add_eos_token``.
"""
from __future__ import annotations

import json
import os
import reprlib

from ..errors import ModelFormatError
from .source import open_regular
from .tokenizer import (_EOG_TEXTS, TOKEN_TYPE_BYTE, TOKEN_TYPE_CONTROL, TOKEN_TYPE_NORMAL, TOKEN_TYPE_UNUSED,
                        TOKEN_TYPE_USER_DEFINED, Tokenizer, _check_token_lengths, _library_errors, _one_line)

__all__ = ["HFTokenizer"]


def _read(path: str) -> str:
    try:
        with open_regular(path, "r", encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ModelFormatError(f"{path}: cannot read: {e}") from None


def _load_object(path: str, text: str | None = None) -> dict:
    """The JSON object in ``path`` (whose ``text`` may have been read already)."""
    try:
        v = json.loads(_read(path) if text is None else text)
    except (ValueError, RecursionError) as e:    # RecursionError: nesting too deep for the parser
        raise ModelFormatError(f"{path}: not valid JSON: {_one_line(e)}") from None
    if not isinstance(v, dict):
        raise ModelFormatError(f"{path}: should be a JSON object, not {type(v).__name__}")
    return v


def _flag(cfg: dict, key: str, path: str, default: bool) -> bool:
    v = cfg.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ModelFormatError(f"{path}: {key!r} should be true or false, got {reprlib.repr(v)}")
    return v


def _chat_template(cfg: dict, path: str) -> str | None:
    """tokenizer_config.json's chat_template: a string, or a list of named ones (the "default" one)."""
    tmpl = cfg.get("chat_template")
    if isinstance(tmpl, list):
        if not all(isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str)
                   for t in tmpl):
            raise ModelFormatError(f"{path}: 'chat_template' should be a string or a list of objects with a "
                                   f"string 'name' and 'template', got {reprlib.repr(tmpl)}")
        named = {t["name"]: t["template"] for t in tmpl}
        tmpl = named.get("default") or next(iter(named.values()), None)
    if tmpl is not None and not isinstance(tmpl, str):
        raise ModelFormatError(f"{path}: 'chat_template' should be a string, got {reprlib.repr(tmpl)}")
    return tmpl or None


def _token_text(v) -> str | None:
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) and v else None


def _types_in(node, wanted: str) -> bool:
    """Whether a tokenizer.json component (or a Sequence of them) has a part of type ``wanted``."""
    if not isinstance(node, dict):
        return False
    if node.get("type") == wanted:
        return True
    for key in ("decoders", "pretokenizers", "normalizers", "processors"):
        if any(_types_in(x, wanted) for x in node.get(key) or []):
            return True
    return False


def _ids(v) -> list[int]:
    if isinstance(v, int) and not isinstance(v, bool):
        return [v]
    if isinstance(v, list):
        return [int(x) for x in v if isinstance(x, int) and not isinstance(x, bool)]
    return []


class HFTokenizer(Tokenizer):
    @classmethod
    def from_folder(cls, folder: str, model_config: dict | None = None, arch: str | None = None,
                    n_vocab: int | None = None) -> HFTokenizer:
        from tokenizers import Tokenizer as RawTokenizer

        path = os.path.join(folder, "tokenizer.json")
        if not os.path.exists(path):
            raise ModelFormatError(f"{folder}: no tokenizer.json (shaderlm reads the fast-tokenizer file; a folder "
                                   f"with only tokenizer.model can be converted by saving it with transformers)")
        raw = _read(path)
        spec = _load_object(path, raw)
        with _library_errors(f"{path}: not a valid tokenizer.json"):
            hf = RawTokenizer.from_str(raw)
            vocab = hf.get_vocab(with_added_tokens=True)
        tc_path = os.path.join(folder, "tokenizer_config.json")
        tcfg = _load_object(tc_path) if os.path.exists(tc_path) else {}
        gen_path = os.path.join(folder, "generation_config.json")
        gcfg = _load_object(gen_path) if os.path.exists(gen_path) else {}
        mcfg = model_config or {}

        self = cls()
        self.arch = arch
        self._hf = hf
        # ids index lists below: bounded by the model's embeddings (or, without them, the vocabulary's size)
        limit = int(n_vocab) if n_vocab else len(vocab)
        rows = f"the model's {limit} token embeddings" if n_vocab else f"the {limit} entries of the vocabulary"
        for a in spec.get("added_tokens") or []:      # the library renumbers those past its vocabulary
            if isinstance(a, dict) and isinstance(a.get("id"), int) and a["id"] >= limit:
                raise ModelFormatError(f"{path}: added token {reprlib.repr(a.get('content'))} has id {a['id']}, "
                                       f"past {rows}")
        top = max(vocab.values(), default=-1)
        if top >= limit:
            name = next(t for t, i in vocab.items() if i == top)
            raise ModelFormatError(f"{path}: token {reprlib.repr(name)} has id {top}, past {rows}")
        _check_token_lengths(list(vocab), path)
        n = max(top + 1, int(n_vocab or 0))
        tokens = [""] * n
        for t, i in vocab.items():
            tokens[i] = t
        types = [TOKEN_TYPE_NORMAL if t else TOKEN_TYPE_UNUSED for t in tokens]
        byte_level = _types_in(spec.get("decoder"), "ByteLevel") or _types_in(spec.get("pre_tokenizer"), "ByteLevel")
        self.kind = "gpt2" if byte_level else "llama"
        if not byte_level:
            for i, t in enumerate(tokens):
                if len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
                    types[i] = TOKEN_TYPE_BYTE
        for a in spec.get("added_tokens") or []:
            i = a.get("id")
            if isinstance(i, int) and 0 <= i < n:
                types[i] = TOKEN_TYPE_CONTROL if a.get("special") else TOKEN_TYPE_USER_DEFINED
        self.tokens = [t if t else f"[UNUSED_{i}]" for i, t in enumerate(tokens)]
        self.token_types = types
        self.vocab_size = n
        self._token_to_id = dict(vocab)
        self._pieces = [None] * n
        self.add_space_prefix = (not byte_level) and (
            _types_in(spec.get("normalizer"), "Prepend")
            or (_types_in(spec.get("pre_tokenizer"), "Metaspace")
                and (spec.get("pre_tokenizer") or {}).get("prepend_scheme", "always") != "never"))

        def tok_id(text_key, id_key):
            text = _token_text(tcfg.get(text_key))
            if text is not None and text in vocab:
                return vocab[text]
            ids = _ids(mcfg.get(id_key))
            return ids[0] if ids and 0 <= ids[0] < n else None

        self.bos_id = tok_id("bos_token", "bos_token_id")
        self.eos_id = tok_id("eos_token", "eos_token_id")
        self.pad_id = tok_id("pad_token", "pad_token_id")
        unk = _token_text(tcfg.get("unk_token"))
        self.unk_id = vocab.get(unk) if unk else None

        # what the post-processor adds around a text (transformers' add_special_tokens=True)
        with _library_errors(f"{path}: the tokenizer fails on 'a'"):
            plain = hf.encode("a", add_special_tokens=False).ids
            full = hf.encode("a", add_special_tokens=True).ids
        k = full.index(plain[0]) if plain and plain[0] in full else 0
        auto_bos = k > 0 and self.bos_id is not None and full[0] == self.bos_id
        auto_eos = len(full) > k + len(plain) and self.eos_id is not None and full[-1] == self.eos_id
        self.add_bos = _flag(tcfg, "add_bos_token", tc_path, auto_bos) and self.bos_id is not None
        self.add_eos = _flag(tcfg, "add_eos_token", tc_path, auto_eos) and self.eos_id is not None

        eos = set()
        for i in [self.eos_id] + _ids(mcfg.get("eos_token_id")) + _ids(gcfg.get("eos_token_id")):
            if i is not None and 0 <= i < n:
                eos.add(i)
        for text in _EOG_TEXTS:
            i = vocab.get(text)
            if i is not None and types[i] == TOKEN_TYPE_CONTROL:
                eos.add(i)
        self.eos_ids = eos

        self.chat_template = _chat_template(tcfg, tc_path)
        self.chat_template_source = f"{tc_path} 'chat_template'"
        jinja = os.path.join(folder, "chat_template.jinja")
        if self.chat_template is None and os.path.exists(jinja):
            self.chat_template = _read(jinja) or None
            self.chat_template_source = jinja
        return self

    def __repr__(self) -> str:
        return (f"HFTokenizer(kind={self.kind!r}, vocab_size={self.vocab_size}, bos_id={self.bos_id}, "
                f"eos_ids={sorted(self.eos_ids)}, add_bos={self.add_bos})")
