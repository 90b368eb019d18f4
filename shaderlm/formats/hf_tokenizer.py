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
from typing import Any

from ..errors import ModelFormatError
from .tokenizer import (_EOG_TEXTS, TOKEN_TYPE_BYTE, TOKEN_TYPE_CONTROL, TOKEN_TYPE_NORMAL, TOKEN_TYPE_UNUSED,
                        TOKEN_TYPE_USER_DEFINED, Tokenizer)

__all__ = ["HFTokenizer"]


def _load(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFormatError(f"{path}: cannot read: {e}") from None


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
        spec = _load(path)
        try:
            hf = RawTokenizer.from_file(path)
        except Exception as e:  # noqa: BLE001 - the library's own parse errors
            raise ModelFormatError(f"{path}: not a valid tokenizer.json: {e}") from None
        tc_path = os.path.join(folder, "tokenizer_config.json")
        tcfg = _load(tc_path) if os.path.exists(tc_path) else {}
        gen_path = os.path.join(folder, "generation_config.json")
        gcfg = _load(gen_path) if os.path.exists(gen_path) else {}
        mcfg = model_config or {}

        self = cls()
        self.arch = arch
        self._hf = hf
        vocab = hf.get_vocab(with_added_tokens=True)
        n = max(max(vocab.values(), default=-1) + 1, int(n_vocab or 0))
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
        plain = hf.encode("a", add_special_tokens=False).ids
        full = hf.encode("a", add_special_tokens=True).ids
        k = full.index(plain[0]) if plain and plain[0] in full else 0
        auto_bos = k > 0 and self.bos_id is not None and full[0] == self.bos_id
        auto_eos = len(full) > k + len(plain) and self.eos_id is not None and full[-1] == self.eos_id
        self.add_bos = bool(tcfg.get("add_bos_token", auto_bos)) and self.bos_id is not None
        self.add_eos = bool(tcfg.get("add_eos_token", auto_eos)) and self.eos_id is not None

        eos = set()
        for i in [self.eos_id] + _ids(mcfg.get("eos_token_id")) + _ids(gcfg.get("eos_token_id")):
            if i is not None and 0 <= i < n:
                eos.add(i)
        for text in _EOG_TEXTS:
            i = vocab.get(text)
            if i is not None and types[i] == TOKEN_TYPE_CONTROL:
                eos.add(i)
        self.eos_ids = eos

        tmpl = tcfg.get("chat_template")
        if isinstance(tmpl, list):      # named templates: the default one
            named = {t.get("name"): t.get("template") for t in tmpl if isinstance(t, dict)}
            tmpl = named.get("default") or next(iter(named.values()), None)
        jinja = os.path.join(folder, "chat_template.jinja")
        if not tmpl and os.path.exists(jinja):
            with open(jinja, encoding="utf-8") as f:
                tmpl = f.read()
        self.chat_template = str(tmpl) if tmpl else None
        return self

    def __repr__(self) -> str:
        return (f"HFTokenizer(kind={self.kind!r}, vocab_size={self.vocab_size}, bos_id={self.bos_id}, "
                f"eos_ids={sorted(self.eos_ids)}, add_bos={self.add_bos})")
