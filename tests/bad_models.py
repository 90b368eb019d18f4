"""A corpus of minimal bad models: each case is one change to a valid tiny model (a synthetic GGUF file or
Hugging Face folder from shaderlm.synth), and `shaderlm run --model BAD -n 2 hi` must end each with exactly
one line on stderr, ``shaderlm: error: ...`` naming the file and the problem, and a non-zero exit code: no
traceback, no hang, never exit 0 (tests/test_bad_models.py).

A case is data: its name, the valid model it starts from (``base``), what it changes in words, the edit
(a function of the parsed model: GGUF keys and tensors, or a folder's JSON files and safetensors
headers), optionally a ``post`` step on the written files (truncation, a FIFO, a symlink), the words the
error line should contain, and extra CLI arguments.

    python tests/bad_models.py OUTDIR                     # write every case to OUTDIR/<case>/
    python tests/bad_models.py OUTDIR --run               # ... and run the CLI on each, print the outcomes
    python tests/bad_models.py OUTDIR --run -k template   # only cases whose name contains "template"
    python tests/bad_models.py OUTDIR --run --where       # ... and where an unexpected exception was raised
    python tests/bad_models.py --list                     # the cases, one a line

Each run is a subprocess with SHADERLM_TUNE=0, a timeout (BAD_MODELS_TIMEOUT, default 30 s: a timeout is
a failure) and an address-space limit (BAD_MODELS_MEMORY_GB, default 3), so that a case that allocates
without bound ends in MemoryError rather than in the machine's swap.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import shutil
import signal
import struct
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:             # run as a script, or pytest without installing the package
    sys.path.insert(0, _ROOT)

import gguf  # noqa: E402
from gguf.constants import GGUFValueType as VT  # noqa: E402

NAN, INF = float("nan"), float("inf")
BIG = 1 << 31                          # 2^31: over every int32 and every sane size
MODEL_FILE = "model.gguf"              # a GGUF case is OUTDIR/<case>/model.gguf
HF_DIR = "model"                       # a folder case is OUTDIR/<case>/model/ (room beside it for '../' files)

# the subprocess guard: a case that tries to allocate without bound gets MemoryError instead of the machine
MEMORY_LIMIT = int(os.environ.get("BAD_MODELS_MEMORY_GB", "3")) << 30
TIMEOUT = float(os.environ.get("BAD_MODELS_TIMEOUT", "30"))


# ======================================================================================================
# GGUF as data: every key with its value type, every tensor with its type id and raw bytes


@dataclass
class GTensor:
    name: str
    shape: tuple                       # numpy order (GGUF dims reversed): (out_features, in_features)
    type: int                          # ggml type id
    data: bytes
    offset: int | None = None          # relative data offset to write instead of the real one
    offset_delta: int = 0              # added to the real relative data offset
    dims: tuple | None = None          # GGUF dims to write instead of reversed(shape)


@dataclass
class GModel:
    kv: dict                           # key -> (GGUFValueType, value); arrays: (ARRAY, (item type, [values]))
    tensors: list
    version: int = 3
    alignment: int = 32
    n_tensors: int | None = None       # header counts to write instead of the real ones
    n_kv: int | None = None
    extra_kv: list = field(default_factory=list)   # (key, type, value) written after kv (duplicates allowed)

    @property
    def arch(self) -> str:
        return self.kv["general.architecture"][1]

    def key(self, k: str) -> str:
        return k.replace("{a}", self.arch)

    def tensor(self, name: str) -> GTensor:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    def value(self, k: str):
        return self.kv[self.key(k)][1]


def read_gguf(path: str) -> GModel:
    r = gguf.GGUFReader(path)
    kv = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF."):
            continue
        vt = VT(int(f.types[0]))
        if vt == VT.ARRAY:
            item = VT(int(f.parts[3][0]))
            vals = f.contents()
            kv[k] = (vt, (item, list(vals)))
        else:
            kv[k] = (vt, f.contents())
    tensors = [GTensor(t.name, tuple(int(d) for d in reversed(t.shape.tolist())), int(t.tensor_type),
                       np.asarray(t.data).tobytes()) for t in r.tensors]
    align = kv.get("general.alignment", (None, 32))[1]
    return GModel(kv, tensors, alignment=int(align))


_SCALAR = {VT.UINT8: "B", VT.INT8: "b", VT.UINT16: "H", VT.INT16: "h", VT.UINT32: "I", VT.INT32: "i",
           VT.FLOAT32: "f", VT.BOOL: "?", VT.UINT64: "Q", VT.INT64: "q", VT.FLOAT64: "d"}


def _gstr(s) -> bytes:
    b = s if isinstance(s, (bytes, bytearray)) else str(s).encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _gvalue(vt: VT, v) -> bytes:
    if vt in _SCALAR:
        return struct.pack("<" + _SCALAR[vt], v)
    if vt == VT.STRING:
        return _gstr(v)
    if vt == VT.ARRAY:
        item, vals = v
        out = [struct.pack("<IQ", int(item), len(vals))]
        out += [_gvalue(item, x) for x in vals]
        return b"".join(out)
    raise ValueError(vt)


def write_gguf(m: GModel, path: str) -> str:
    """Write `m` as it is (no checks: that is the point)."""
    out = bytearray(b"GGUF")
    out += struct.pack("<IQQ", m.version, len(m.tensors) if m.n_tensors is None else m.n_tensors,
                       len(m.kv) + len(m.extra_kv) if m.n_kv is None else m.n_kv)
    for k, vt, v in [(k, vt, v) for k, (vt, v) in m.kv.items()] + list(m.extra_kv):
        out += _gstr(k) + struct.pack("<I", int(vt)) + _gvalue(vt, v)
    pos, offsets = 0, []
    for t in m.tensors:
        offsets.append(pos)
        pos += len(t.data) + (-len(t.data) % m.alignment)
    for t, off in zip(m.tensors, offsets):
        dims = t.dims if t.dims is not None else tuple(reversed(t.shape))
        out += _gstr(t.name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", t.type, (off if t.offset is None else t.offset) + t.offset_delta)
    out += b"\0" * (-len(out) % m.alignment)
    for t in m.tensors:
        out += t.data + b"\0" * (-len(t.data) % m.alignment)
    with open(path, "wb") as f:
        f.write(out)
    return path


# ======================================================================================================
# Hugging Face folders as data: JSON files as values, safetensors files as (header entries, bytes)


@dataclass
class STensor:
    name: str
    dtype: str
    shape: list
    data: bytes
    offsets: list | None = None        # data_offsets to write instead of the real ones (data still written)
    reoffset: Callable | None = None   # reoffset(real offsets, {name: real offsets}) -> the data_offsets to write
    gap: int = 0                        # zero bytes written before this tensor's data


_ABSENT = object()


@dataclass
class STFile:
    tensors: list
    metadata: Any = field(default_factory=lambda: {"format": "pt"})   # _ABSENT: no __metadata__
    trailing: bytes = b""

    def tensor(self, name: str) -> STensor:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    def to_bytes(self) -> bytes:
        header: dict = {} if self.metadata is _ABSENT else {"__metadata__": self.metadata}
        blob, pos, real = bytearray(), 0, {}
        for t in self.tensors:
            blob += b"\0" * t.gap
            pos += t.gap
            offs = real[t.name] = [pos, pos + len(t.data)]
            if t.reoffset is not None:
                offs = t.reoffset(offs, real)
            header[t.name] = {"dtype": t.dtype, "shape": t.shape,
                              "data_offsets": t.offsets if t.offsets is not None else offs}
            blob += t.data
            pos += len(t.data)
        head = json.dumps(header, separators=(",", ":")).encode()
        head += b" " * (-len(head) % 8)
        return struct.pack("<Q", len(head)) + head + bytes(blob) + self.trailing


def read_safetensors(path: str) -> STFile:
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack_from("<Q", raw)
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    meta = header.pop("__metadata__", _ABSENT)
    items = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    return STFile([STensor(k, v["dtype"], list(v["shape"]), data[v["data_offsets"][0]:v["data_offsets"][1]])
                   for k, v in items], meta)


@dataclass
class HFModel:
    json: dict                          # file name -> JSON value (config.json, tokenizer.json, ...)
    st: dict                            # file name -> STFile
    raw: dict = field(default_factory=dict)   # file name -> bytes written as they are (wins over both)

    @property
    def config(self) -> dict:
        return self.json["config.json"]

    @property
    def tokenizer(self) -> dict:
        return self.json["tokenizer.json"]

    @property
    def index(self) -> dict:
        return self.json["model.safetensors.index.json"]

    def find(self, tensor: str) -> tuple[str, STensor]:
        for fname, f in self.st.items():
            for t in f.tensors:
                if t.name == tensor:
                    return fname, t
        raise KeyError(tensor)

    def drop(self, tensor: str) -> None:
        fname, t = self.find(tensor)
        self.st[fname].tensors.remove(t)
        if "model.safetensors.index.json" in self.json:
            self.index["weight_map"].pop(tensor, None)


def read_hf(folder: str) -> HFModel:
    js, st = {}, {}
    for n in sorted(os.listdir(folder)):
        p = os.path.join(folder, n)
        if n.endswith(".json"):
            with open(p, encoding="utf-8") as f:
                js[n] = json.load(f)
        elif n.endswith(".safetensors"):
            st[n] = read_safetensors(p)
    return HFModel(js, st)


def write_hf(m: HFModel, folder: str) -> str:
    os.makedirs(folder, exist_ok=True)
    for n, v in m.json.items():
        with open(os.path.join(folder, n), "w", encoding="utf-8") as f:
            json.dump(v, f, indent=1)          # allow_nan: NaN / Infinity written as Python's json reads them
    for n, v in m.st.items():
        with open(os.path.join(folder, n), "wb") as f:
            f.write(v.to_bytes())
    for n, v in m.raw.items():
        with open(os.path.join(folder, n), "wb") as f:
            f.write(v)
    return folder


# ======================================================================================================
# the valid models every case starts from


def _bases() -> dict[str, Callable[[str], str]]:
    from shaderlm.synth import write_synthetic_gguf, write_synthetic_hf
    return {
        # dim 96, 2 layers, 4 heads / 2 KV heads of 24, ffn 160, vocab 300, context 256; every matrix Q8_0
        "llama": lambda p: write_synthetic_gguf(os.path.join(p, MODEL_FILE), preset="tiny", arch="llama",
                                                quant="Q8_0"),
        "gemma3": lambda p: write_synthetic_gguf(os.path.join(p, MODEL_FILE), preset="tiny", arch="gemma3",
                                                 quant="Q8_0"),
        # 64 layers: per-layer buffers that fit one by one and not all together
        # 8 experts, 2 picked a token, expert FFN 64; the router F32, the rest Q8_0
        "qwen3moe": lambda p: write_synthetic_gguf(os.path.join(p, MODEL_FILE), preset="tiny", arch="qwen3moe",
                                                   quant="Q8_0"),
        "llama64": lambda p: write_synthetic_gguf(os.path.join(p, MODEL_FILE), preset="tiny", arch="llama",
                                                  quant="Q8_0", n_layers=64),
        "hf": lambda p: write_synthetic_hf(os.path.join(p, HF_DIR), preset="tiny", arch="llama", dtype="BF16"),
        # several shards and model.safetensors.index.json
        "hf-sharded": lambda p: write_synthetic_hf(os.path.join(p, HF_DIR), preset="tiny", arch="llama",
                                                   dtype="BF16", shard_bytes=60_000),
    }


class Bases:
    """Each base model written once (under `root`/_bases) and parsed on demand."""

    def __init__(self, root: str):
        self.root = os.path.join(root, "_bases")
        self._paths: dict = {}

    def path(self, base: str) -> str:
        if base not in self._paths:
            d = os.path.join(self.root, base)
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
            self._paths[base] = _bases()[base](d)
        return self._paths[base]

    def model(self, base: str):
        p = self.path(base)
        return read_hf(p) if os.path.isdir(p) else read_gguf(p)


# ======================================================================================================
# cases


@dataclass(frozen=True)
class Case:
    name: str
    base: str                          # a key of _bases(), or "none" (the edit writes everything)
    change: str                        # what is wrong, in words
    edit: Callable | None = None       # edit(model): mutates a GModel / HFModel before it is written
    post: Callable | None = None       # post(model_path, case_dir): damage after writing (truncate, FIFO, ...)
    expect: tuple = ()                 # words the error line must contain (case-insensitive; "a|b": either)
    args: tuple = ()                   # extra CLI arguments
    isolate: bool = False              # only ever run as a subprocess: may hang, abort or allocate without bound
    names_file: bool = True            # the error line must name the model (its case folder)

    @property
    def kind(self) -> str:
        return "hf" if self.base.startswith("hf") else "gguf"

    @property
    def idle_wait(self) -> bool:
        """A case that may block without using CPU or memory (a FIFO): it can run beside the others."""
        return "fifo" in self.name


def model_path(case: Case, case_dir: str) -> str:
    return os.path.join(case_dir, HF_DIR if case.kind == "hf" or case.base == "none" else MODEL_FILE)


def write_case(case: Case, root: str, bases: Bases) -> str:
    """Write `case` into root/<name>/ and return the path to give --model."""
    case_dir = os.path.join(root, case.name)
    shutil.rmtree(case_dir, ignore_errors=True)
    os.makedirs(case_dir)
    path = model_path(case, case_dir)
    if case.base != "none":
        m = bases.model(case.base)
        if case.edit is not None:
            case.edit(m)
        if isinstance(m, HFModel):
            write_hf(m, path)
        else:
            write_gguf(m, path)
    if case.post is not None:
        case.post(path, case_dir)
    return path


# ---- edit helpers: each returns edit(model) ----------------------------------------------------------


def edits(*fns) -> Callable:
    def edit(m):
        for fn in fns:
            fn(m)
    return edit


def kv(key: str, vt: VT, value) -> Callable:
    """Set GGUF key ("{a}" is the architecture) to a value of type vt."""
    def edit(m: GModel):
        m.kv[m.key(key)] = (vt, value)
    return edit


def kv_array(key: str, item: VT, values) -> Callable:
    return kv(key, VT.ARRAY, (item, list(values)))


def no_kv(key: str) -> Callable:
    def edit(m: GModel):
        del m.kv[m.key(key)]
    return edit


def kv_fn(key: str, fn: Callable) -> Callable:
    """Replace a key's (type, value) by fn((type, value))."""
    def edit(m: GModel):
        m.kv[m.key(key)] = fn(m.kv[m.key(key)])
    return edit


def tensor(which: str, **changes) -> Callable:
    """Change a GGUF tensor's fields (name, shape, type, data, offset, dims); values may be functions of it."""
    def edit(m: GModel):
        t = m.tensor(which)
        for k, v in changes.items():
            setattr(t, k, v(t) if callable(v) else v)
    return edit


def drop_tensor(name: str) -> Callable:
    def edit(m: GModel):
        m.tensors.remove(m.tensor(name))
    return edit


def header(**changes) -> Callable:
    def edit(m: GModel):
        for k, v in changes.items():
            setattr(m, k, v(m) if callable(v) else v)
    return edit


def template(src) -> Callable:
    return kv("tokenizer.chat_template", VT.STRING, src)


def config(**changes) -> Callable:
    """Set config.json keys (a value _ABSENT deletes the key)."""
    def edit(m: HFModel):
        for k, v in changes.items():
            if v is _ABSENT:
                m.config.pop(k, None)
            else:
                m.config[k] = v
    return edit


def json_file(name: str, value) -> Callable:
    def edit(m: HFModel):
        m.json[name] = value
    return edit


def json_edit(name: str, fn: Callable) -> Callable:
    """fn(value) mutates the parsed JSON file in place."""
    def edit(m: HFModel):
        fn(m.json[name])
    return edit


def raw_file(name: str, data: bytes) -> Callable:
    def edit(m: HFModel):
        m.json.pop(name, None)
        m.raw[name] = data
    return edit


def st_tensor(which: str, **changes) -> Callable:
    """Change a safetensors tensor's fields (dtype, shape, data, offsets, gap); values may be functions of it."""
    def edit(m: HFModel):
        _, t = m.find(which)
        for k, v in changes.items():
            setattr(t, k, v(t) if callable(v) else v)
    return edit


def st_file(fname: str = "model.safetensors", **changes) -> Callable:
    def edit(m: HFModel):
        f = m.st[fname]
        for k, v in changes.items():
            setattr(f, k, v(f) if callable(v) else v)
    return edit


def drop_st(name: str) -> Callable:
    def edit(m: HFModel):
        m.drop(name)
    return edit


def weight_map(fn: Callable) -> Callable:
    """fn(name, file) -> the file name the index should say for that tensor."""
    def edit(m: HFModel):
        wm = m.index["weight_map"]
        for k in list(wm):
            wm[k] = fn(k, wm[k])
    return edit


def first_shard(m: HFModel) -> str:
    return sorted(m.st)[0]


def shard_edit(fn: Callable) -> Callable:
    """fn(model, first shard's name): for the sharded base."""
    def edit(m: HFModel):
        fn(m, first_shard(m))
    return edit


# ---- post helpers: post(model path, case dir) -----------------------------------------------------------


def truncate(fraction: float) -> Callable:
    def post(path, case_dir):
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.truncate(int(size * fraction))
    return post


def replace_with_fifo(rel: str | None = None) -> Callable:
    """Replace the model file (or folder/rel) by a FIFO: opening it for reading blocks until a writer comes."""
    def post(path, case_dir):
        p = path if rel is None else os.path.join(path, rel)
        if os.path.exists(p):
            os.remove(p)
        os.mkfifo(p)
    return post


def replace_with_dir(rel: str) -> Callable:
    def post(path, case_dir):
        p = os.path.join(path, rel)
        if os.path.exists(p):
            os.remove(p)
        os.makedirs(p)
        with open(os.path.join(p, "x"), "w") as f:
            f.write("x")
    return post


def shard_post(fn: Callable) -> Callable:
    """fn(folder, first shard's name, case_dir)."""
    def post(path, case_dir):
        shard = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))[0]
        fn(path, shard, case_dir)
    return post


def _outside_copy(folder: str, shard: str, case_dir: str) -> str:
    """Move a shard out of the folder, to case_dir/outside/; return its new path."""
    out = os.path.join(case_dir, "outside")
    os.makedirs(out, exist_ok=True)
    dst = os.path.join(out, shard)
    shutil.move(os.path.join(folder, shard), dst)
    return dst


def _symlink_out(folder, shard, case_dir):
    os.symlink(os.path.relpath(_outside_copy(folder, shard, case_dir), folder), os.path.join(folder, shard))


def _index_points_out(rel: bool) -> Callable:
    """Move the first shard beside the folder (case_dir/secret.safetensors) and point the index at it."""
    def post(folder, case_dir):
        idx_path = os.path.join(folder, "model.safetensors.index.json")
        with open(idx_path, encoding="utf-8") as f:
            idx = json.load(f)
        shard = sorted(set(idx["weight_map"].values()))[0]
        secret = os.path.join(case_dir, "secret.safetensors")
        shutil.move(os.path.join(folder, shard), secret)
        target = "../secret.safetensors" if rel else os.path.abspath(secret)
        idx["weight_map"] = {k: (target if v == shard else v) for k, v in idx["weight_map"].items()}
        with open(idx_path, "w", encoding="utf-8") as f:
            json.dump(idx, f, indent=1)
    return post


def _empty_folder(path, case_dir):
    os.makedirs(path)
    with open(os.path.join(path, "README.md"), "w") as f:
        f.write("no model here\n")


# ---- data for the edits ----------------------------------------------------------------------------------


def _q8_rows(rows: int, cols: int) -> bytes:
    """Q8_0 bytes of a rows x cols matrix (scale 0.01, random int8)."""
    rng = np.random.default_rng(rows * 7919 + cols)
    blocks = np.zeros((rows * cols // 32, 34), np.uint8)
    blocks[:, 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    blocks[:, 2:] = rng.integers(0, 256, (blocks.shape[0], 32), dtype=np.uint8)
    return blocks.tobytes()


def _bf16(n: int) -> bytes:
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32) * 0.05
    return (x.view(np.uint32) >> 16).astype(np.uint16).tobytes()


def _tokens_edit(fn: Callable) -> Callable:
    """fn(tokens, types) -> (tokens, types): the GGUF vocabulary."""
    def edit(m: GModel):
        tok_t, (item, tokens) = m.kv["tokenizer.ggml.tokens"]
        typ_t, (titem, types) = m.kv["tokenizer.ggml.token_type"]
        tokens, types = fn(list(tokens), list(types))
        m.kv["tokenizer.ggml.tokens"] = (tok_t, (item, tokens))
        m.kv["tokenizer.ggml.token_type"] = (typ_t, (titem, types))
    return edit


def _spm_with_long_token(m: GModel):
    """The vocabulary as a SentencePiece one (scores, no merges) whose last token is 200,000 characters."""
    def fn(tokens, types):
        tokens[-1] = "a" * 200_000
        types[-1] = 1
        return tokens, types
    _tokens_edit(fn)(m)
    n = len(m.value("tokenizer.ggml.tokens")[1])
    m.kv["tokenizer.ggml.model"] = (VT.STRING, "llama")
    del m.kv["tokenizer.ggml.merges"]
    m.kv["tokenizer.ggml.scores"] = (VT.ARRAY, (VT.FLOAT32, [-float(i) for i in range(n)]))


def _hi_token_past_embedding(tokens, types):
    """A user-defined token "hi" (the prompt, matched whole) with id 400: past the 300 embedding rows."""
    while len(tokens) < 400:
        tokens.append(f"<extra_{len(tokens)}>")
        types.append(5)
    tokens.append("hi")
    types.append(4)
    return tokens, types


def _tok_model(fn: Callable) -> Callable:
    return json_edit("tokenizer.json", lambda t: fn(t["model"]))


def _added_hi(t: dict):
    t["added_tokens"].append({"id": 5000, "content": "hi", "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": False})


def _deep_json(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def _st_overlap(m: HFModel):
    """model.norm.weight stored nowhere: its data_offsets are those of layer 1's post_attention_layernorm
    (the same size), so two tensors share bytes."""
    f = m.st["model.safetensors"]
    b = f.tensor("model.norm.weight")
    b.data = b""
    b.reoffset = lambda offs, real: real["model.layers.1.post_attention_layernorm.weight"]
    f.tensors.remove(b)
    f.tensors.append(b)               # after the tensor it points at


_HUGE_MUL = "{{ 'a' * 3000000000 }}"
_RECURSIVE = "{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}"
_NESTED_LOOPS = "{% for a in range(99999) %}{% for b in range(99999) %}{{ a }}{% endfor %}{% endfor %}"
_HUGE_RANGE = "{% for i in range(10000000000) %}x{% endfor %}"


def _cases() -> list[Case]:
    S, U32, I32, F32, U64, F64, I64 = VT.STRING, VT.UINT32, VT.INT32, VT.FLOAT32, VT.UINT64, VT.FLOAT64, VT.INT64
    C = Case
    out = [
        # ---- GGUF: values of the wrong kind or range -----------------------------------------------------
        C("gguf-head-count-nan", "llama", "{a}.attention.head_count = NaN (float32)",
          kv("{a}.attention.head_count", F32, NAN), expect=("head_count",)),
        C("gguf-head-count-inf", "llama", "{a}.attention.head_count = inf (float64)",
          kv("{a}.attention.head_count", F64, INF), expect=("head_count",)),
        C("gguf-head-count-zero", "llama", "{a}.attention.head_count = 0",
          kv("{a}.attention.head_count", U32, 0), expect=("head_count",)),
        C("gguf-head-count-negative", "llama", "{a}.attention.head_count = -4 (int32)",
          kv("{a}.attention.head_count", I32, -4), expect=("head_count",)),
        C("gguf-head-count-2e31", "llama", "{a}.attention.head_count = 2^31",
          kv("{a}.attention.head_count", U32, BIG), expect=("head_count|attn_q",)),
        C("gguf-head-count-string", "llama", "{a}.attention.head_count = '4' (a string)",
          kv("{a}.attention.head_count", S, "4"), expect=("head_count",)),
        C("gguf-kv-heads-zero", "llama", "{a}.attention.head_count_kv = 0",
          kv("{a}.attention.head_count_kv", U32, 0), expect=("head_count_kv|kv_heads",)),
        C("gguf-kv-heads-not-divisor", "llama", "{a}.attention.head_count_kv = 3 (4 heads)",
          kv("{a}.attention.head_count_kv", U32, 3), expect=("head_count|head count",)),
        C("gguf-block-count-zero", "llama", "{a}.block_count = 0",
          kv("{a}.block_count", U32, 0), expect=("block_count",)),
        C("gguf-block-count-negative", "llama", "{a}.block_count = -1 (int32)",
          kv("{a}.block_count", I32, -1), expect=("block_count",)),
        C("gguf-block-count-nan", "llama", "{a}.block_count = NaN (float32)",
          kv("{a}.block_count", F32, NAN), expect=("block_count",)),
        C("gguf-block-count-string", "llama", "{a}.block_count = '2' (a string)",
          kv("{a}.block_count", S, "2"), expect=("block_count",)),
        C("gguf-block-count-array", "llama", "{a}.block_count = [2, 2] (an array)",
          kv_array("{a}.block_count", U32, [2, 2]), expect=("block_count",)),
        C("gguf-block-count-extra-layer", "llama", "{a}.block_count = 3, tensors for blk.0 and blk.1 only",
          kv("{a}.block_count", U32, 3), expect=("block_count|blk.2",)),
        C("gguf-block-count-2e31", "llama", "{a}.block_count = 2^31 (must fail before per-layer work)",
          kv("{a}.block_count", U32, BIG), expect=("block_count|blk.2",), isolate=True),
        C("gguf-embedding-length-zero", "llama", "{a}.embedding_length = 0",
          kv("{a}.embedding_length", U32, 0), expect=("embedding_length",)),
        C("gguf-embedding-length-negative", "llama", "{a}.embedding_length = -96 (int32)",
          kv("{a}.embedding_length", I32, -96), expect=("embedding_length",)),
        C("gguf-embedding-length-inf", "llama", "{a}.embedding_length = inf (float64)",
          kv("{a}.embedding_length", F64, INF), expect=("embedding_length",)),
        C("gguf-embedding-length-2e31", "llama", "{a}.embedding_length = 2^31",
          kv("{a}.embedding_length", U32, BIG), expect=("embedding_length",)),
        C("gguf-context-length-zero", "llama", "{a}.context_length = 0",
          kv("{a}.context_length", U32, 0), expect=("context_length",)),
        C("gguf-context-length-negative", "llama", "{a}.context_length = -1 (int64)",
          kv("{a}.context_length", I64, -1), expect=("context_length",)),
        C("gguf-context-length-nan", "llama", "{a}.context_length = NaN (float64)",
          kv("{a}.context_length", F64, NAN), expect=("context_length",)),
        C("gguf-key-length-negative", "llama", "{a}.attention.key_length = -24 (int32)",
          kv("{a}.attention.key_length", I32, -24), expect=("key_length|head_dim",)),
        C("gguf-key-length-2e31", "llama", "{a}.attention.key_length = 2^31",
          kv("{a}.attention.key_length", U32, BIG), expect=("key_length|head_dim|attn_q",)),
        C("gguf-feed-forward-length-zero", "llama", "{a}.feed_forward_length = 0 (ffn tensors are 160)",
          kv("{a}.feed_forward_length", U32, 0), expect=("feed_forward_length",)),
        # ---- mixtures of experts ------------------------------------------------------------------------
        C("gguf-experts-used-over-count", "qwen3moe", "{a}.expert_used_count = 9 of 8 experts",
          kv("{a}.expert_used_count", U32, 9), expect=("experts used|expert",)),
        C("gguf-experts-used-zero", "qwen3moe", "{a}.expert_used_count = 0",
          kv("{a}.expert_used_count", U32, 0), expect=("expert_used_count",)),
        C("gguf-experts-no-router", "qwen3moe", "blk.0.ffn_gate_inp.weight (the router) is missing",
          drop_tensor("blk.0.ffn_gate_inp.weight"), expect=("ffn_gate_inp",)),
        C("gguf-expert-ffn-mismatch", "qwen3moe", "{a}.expert_feed_forward_length = 32 (the experts are 64)",
          kv("{a}.expert_feed_forward_length", U32, 32), expect=("ffn_gate_exps|ffn_down_exps",)),
        C("gguf-rms-eps-negative", "llama", "{a}.attention.layer_norm_rms_epsilon = -1e-5",
          kv("{a}.attention.layer_norm_rms_epsilon", F32, -1e-5), expect=("epsilon|rms",)),
        C("gguf-rms-eps-nan", "llama", "{a}.attention.layer_norm_rms_epsilon = NaN",
          kv("{a}.attention.layer_norm_rms_epsilon", F32, NAN), expect=("epsilon|rms",)),
        C("gguf-rope-base-zero", "llama", "{a}.rope.freq_base = 0",
          kv("{a}.rope.freq_base", F32, 0.0), expect=("freq_base|rope_base",)),
        C("gguf-rope-base-string", "llama", "{a}.rope.freq_base = '10000' (a string)",
          kv("{a}.rope.freq_base", S, "10000"), expect=("freq_base|rope_base",)),
        C("gguf-rope-scaling-type-array", "llama", "{a}.rope.scaling.type = ['linear'] (an array)",
          edits(kv_array("{a}.rope.scaling.type", S, ["linear"]), kv("{a}.rope.scaling.factor", F32, 2.0)),
          expect=("scaling.type",)),
        C("gguf-rope-scaling-unknown", "llama", "{a}.rope.scaling.type = 'yarn' (not implemented)",
          edits(kv("{a}.rope.scaling.type", S, "yarn"), kv("{a}.rope.scaling.factor", F32, 4.0)),
          expect=("yarn",)),
        C("gguf-rope-scaling-factor-nan", "llama", "{a}.rope.scaling.type = 'linear', factor NaN",
          edits(kv("{a}.rope.scaling.type", S, "linear"), kv("{a}.rope.scaling.factor", F32, NAN)),
          expect=("factor",)),
        C("gguf-name-array", "llama", "general.name = ['a', 'b'] (an array where a string is due)",
          kv_array("general.name", S, ["a", "b"]), expect=("general.name",)),
        C("gguf-architecture-array", "llama", "general.architecture = ['llama'] (an array)",
          kv_array("general.architecture", S, ["llama"]), expect=("general.architecture", "string|array")),
        C("gguf-alignment-zero", "llama", "general.alignment = 0",
          kv("general.alignment", U32, 0), expect=("alignment",)),
        C("gguf-alignment-string", "llama", "general.alignment = '32' (a string)",
          kv("general.alignment", S, "32"), expect=("alignment",)),
        C("gguf-gemma-key-length-negative", "gemma3", "gemma3.attention.key_length = -24 (int32)",
          kv("{a}.attention.key_length", I32, -24), expect=("key_length|head_dim",)),
        C("gguf-gemma-sliding-window-negative", "gemma3", "gemma3.attention.sliding_window = -8 (int32)",
          kv("{a}.attention.sliding_window", I32, -8), expect=("sliding",)),
        C("gguf-gemma-swa-pattern-short", "gemma3", "gemma3.attention.sliding_window_pattern: 3 flags, 6 layers",
          kv_array("{a}.attention.sliding_window_pattern", VT.BOOL, [True, True, False]),
          expect=("sliding",)),
        C("gguf-gemma-softcap-negative", "gemma3", "gemma3.final_logit_softcapping = -30",
          kv("{a}.final_logit_softcapping", F32, -30.0), expect=("softcap",)),

        # ---- GGUF tokenizer keys -------------------------------------------------------------------------
        C("gguf-tokens-missing", "llama", "tokenizer.ggml.tokens removed",
          no_kv("tokenizer.ggml.tokens"), expect=("tokenizer.ggml.tokens",)),
        C("gguf-tokens-string", "llama", "tokenizer.ggml.tokens = 'abc' (a string where an array is due)",
          kv("tokenizer.ggml.tokens", S, "abc"), expect=("tokenizer.ggml.tokens",)),
        C("gguf-tokens-short", "llama", "tokenizer.ggml.tokens: 250 tokens for 300 embedding rows",
          _tokens_edit(lambda tk, ty: (tk[:250], ty[:250])), expect=("250", "300")),
        C("gguf-tokens-past-embedding", "llama",
          "tokenizer.ggml.tokens: 401 tokens, the user-defined token 'hi' (id 400) past the 300 embedding rows",
          _tokens_edit(_hi_token_past_embedding), expect=("401|400", "300")),
        C("gguf-token-type-string", "llama", "tokenizer.ggml.token_type = 'normal' (a string)",
          kv("tokenizer.ggml.token_type", S, "normal"), expect=("token_type",)),
        C("gguf-token-type-floats", "llama", "tokenizer.ggml.token_type: NaN floats",
          kv_fn("tokenizer.ggml.token_type", lambda v: (VT.ARRAY, (VT.FLOAT32, [NAN] * len(v[1][1])))),
          expect=("token_type",)),
        C("gguf-model-array", "llama", "tokenizer.ggml.model = ['gpt2'] (an array)",
          kv_array("tokenizer.ggml.model", S, ["gpt2"]), expect=("tokenizer.ggml.model",)),
        C("gguf-pre-array", "llama", "tokenizer.ggml.pre = ['gpt-2'] (an array where a string is due)",
          kv_array("tokenizer.ggml.pre", S, ["gpt-2"]), expect=("tokenizer.ggml.pre",)),
        C("gguf-merges-ints", "llama", "tokenizer.ggml.merges = [1, 2, 3] (ints)",
          kv_array("tokenizer.ggml.merges", U32, [1, 2, 3]), expect=("merges",)),
        C("gguf-merge-no-space", "llama", "tokenizer.ggml.merges: an entry without a space",
          kv_fn("tokenizer.ggml.merges", lambda v: (v[0], (v[1][0], ["abc"] + list(v[1][1])))),
          expect=("merges",)),
        C("gguf-bos-id-string", "llama", "tokenizer.ggml.bos_token_id = 'one' (a string)",
          kv("tokenizer.ggml.bos_token_id", S, "one"), expect=("bos_token_id",)),
        C("gguf-eos-id-negative", "llama", "tokenizer.ggml.eos_token_id = -5 (int32)",
          kv("tokenizer.ggml.eos_token_id", I32, -5), expect=("eos_token_id",)),
        C("gguf-spm-token-200k", "llama",
          "SentencePiece vocabulary (tokenizer.ggml.model = 'llama') with a 200,000-character token",
          _spm_with_long_token, expect=("token",), isolate=True),

        # ---- GGUF chat templates -------------------------------------------------------------------------
        C("gguf-template-array", "llama", "tokenizer.chat_template = ['{{ messages }}', 'x'] (an array)",
          kv_array("tokenizer.chat_template", S, ["{{ messages }}", "x"]), expect=("chat_template",)),
        C("gguf-template-number", "llama", "tokenizer.chat_template = 5 (a number)",
          kv("tokenizer.chat_template", U32, 5), expect=("chat_template",)),
        C("gguf-template-syntax", "llama", "tokenizer.chat_template = '{% for %}' (a syntax error)",
          template("{% for %}"), expect=("chat_template",)),
        C("gguf-template-huge-range", "llama", "tokenizer.chat_template loops over range(10^10)",
          template(_HUGE_RANGE), expect=("chat_template",)),
        C("gguf-template-huge-string", "llama", "tokenizer.chat_template = {{ 'a' * 3000000000 }}",
          template(_HUGE_MUL), expect=("chat_template",), isolate=True),
        C("gguf-template-recursive-macro", "llama", "tokenizer.chat_template: a macro that calls itself",
          template(_RECURSIVE), expect=("chat_template",), isolate=True),
        C("gguf-template-nested-loops", "llama", "tokenizer.chat_template: two nested loops of 99,999",
          template(_NESTED_LOOPS), expect=("chat_template",), isolate=True),

        # ---- GGUF tensors: accepted but wrong ------------------------------------------------------------
        C("gguf-attn-q-48x96", "llama", "blk.0.attn_q.weight is 48x96 where 96x96 is due",
          tensor("blk.0.attn_q.weight", shape=(48, 96), data=_q8_rows(48, 96)), expect=("attn_q",)),
        C("gguf-token-embd-short", "llama", "token_embd.weight has 250 rows for a vocabulary of 300",
          tensor("token_embd.weight", shape=(250, 96), data=_q8_rows(250, 96)), expect=("token_embd",)),
        C("gguf-norm-zero-length", "llama", "blk.0.attn_norm.weight has 0 elements",
          tensor("blk.0.attn_norm.weight", shape=(0,), data=b""), expect=("attn_norm",)),
        C("gguf-tensor-missing", "llama", "blk.1.ffn_down.weight removed",
          drop_tensor("blk.1.ffn_down.weight"), expect=("ffn_down",)),
        C("gguf-output-norm-missing", "llama", "output_norm.weight removed",
          drop_tensor("output_norm.weight"), expect=("output_norm",)),
        C("gguf-tensor-iq2xxs", "llama", "blk.0.attn_q.weight stored as IQ2_XXS (a type shaderlm has no kernel for)",
          tensor("blk.0.attn_q.weight", type=16, data=b"\x01" * (96 * 96 // 256 * 66)), expect=("IQ2_XXS",)),
        C("gguf-tensor-type-99", "llama", "blk.0.attn_q.weight has ggml type id 99",
          tensor("blk.0.attn_q.weight", type=99), expect=("99",)),
        C("gguf-tensor-5-dims", "llama", "blk.0.attn_q.weight has 5 dimensions",
          tensor("blk.0.attn_q.weight", dims=(96, 96, 1, 1, 1)), expect=("attn_q",)),
        C("gguf-tensor-dims-overflow", "llama", "blk.0.attn_q.weight dims 2^40 x 2^40 (product past 2^64)",
          tensor("blk.0.attn_q.weight", dims=(1 << 40, 1 << 40)), expect=("attn_q",)),
        C("gguf-duplicate-tensor", "llama", "blk.0.attn_k.weight renamed blk.0.attn_q.weight (two of them)",
          tensor("blk.0.attn_k.weight", name="blk.0.attn_q.weight"), expect=("attn_q",)),
        C("gguf-duplicate-key", "llama", "general.name appears twice",
          header(extra_kv=[("general.name", VT.STRING, "again")]), expect=("general.name",)),
        C("gguf-offset-past-end", "llama", "output.weight's data offset is 2^40 (past the end of the file)",
          tensor("output.weight", offset=1 << 40), expect=("output.weight",)),
        C("gguf-offset-misaligned", "llama", "output.weight's data offset is not a multiple of the alignment",
          tensor("output.weight", offset_delta=1), expect=("output.weight",)),
        C("gguf-truncated", "llama", "the file cut at 60% (tensor data past the end)",
          post=truncate(0.6), expect=("truncated",)),
        C("gguf-truncated-header", "llama", "the file cut at 3% (inside the metadata)",
          post=truncate(0.03), expect=("truncated",)),
        C("gguf-tensor-count-huge", "llama", "the header says 2^40 tensors",
          header(n_tensors=1 << 40), expect=("1099511627776|1,099,511,627,776|count",)),
        C("gguf-kv-count-huge", "llama", "the header says 2^40 metadata keys",
          header(n_kv=1 << 40), expect=("metadata|key",)),
        C("gguf-version-1", "llama", "GGUF version 1", header(version=1), expect=("version",)),
        C("gguf-empty-file", "llama", "a 0-byte file", post=truncate(0.0), expect=("GGUF|empty|bytes",)),

        # ---- GGUF: unbounded GPU work and limits -----------------------------------------------------------
        C("gguf-ctx-1e8", "llama", "{a}.context_length = 2^31 and -c 100000000: a KV cache over the binding limit",
          kv("{a}.context_length", U32, BIG), args=("-c", "100000000"), expect=("100000000", "limit"),
          isolate=True, names_file=False),
        C("gguf-ctx-2e40", "llama", "{a}.context_length = 2^40 and -c 2^40: a token buffer over the largest buffer",
          kv("{a}.context_length", U64, 1 << 40), args=("-c", str(1 << 40)), expect=("1099511627776|context",),
          isolate=True, names_file=False),
        C("gguf-kv-cache-over-memory", "llama64",
          "64 layers and -c 1048576: each layer's KV cache fits the binding limit, all of them (12 GiB) not memory",
          kv("{a}.context_length", U32, 1 << 20), args=("-c", str(1 << 20)), expect=("context|ctx|kv",),
          isolate=True, names_file=False),
        C("gguf-model-is-fifo", "llama", "--model names a FIFO (opening it blocks)",
          post=replace_with_fifo(), expect=("regular|fifo|not a file",), isolate=True),
        C("model-empty-folder", "none", "--model names a folder with neither config.json nor a model",
          post=_empty_folder, expect=("config.json",)),

        # ---- Hugging Face config.json --------------------------------------------------------------------
        C("hf-heads-zero", "hf", "num_attention_heads = 0", config(num_attention_heads=0),
          expect=("num_attention_heads",)),
        C("hf-heads-negative", "hf", "num_attention_heads = -4", config(num_attention_heads=-4),
          expect=("num_attention_heads",)),
        C("hf-heads-nan", "hf", "num_attention_heads = NaN", config(num_attention_heads=NAN),
          expect=("num_attention_heads",)),
        C("hf-heads-string", "hf", "num_attention_heads = '4'", config(num_attention_heads="4"),
          expect=("num_attention_heads",)),
        C("hf-kv-heads-zero", "hf", "num_key_value_heads = 0", config(num_key_value_heads=0),
          expect=("num_key_value_heads|kv_heads",)),
        C("hf-layers-minus-one", "hf", "num_hidden_layers = -1", config(num_hidden_layers=-1),
          expect=("num_hidden_layers",)),
        C("hf-layers-float", "hf", "num_hidden_layers = 2.5", config(num_hidden_layers=2.5),
          expect=("num_hidden_layers",)),
        C("hf-layers-extra", "hf", "num_hidden_layers = 3, tensors for layers 0 and 1 only",
          config(num_hidden_layers=3), expect=("num_hidden_layers|layers.2",)),
        C("hf-layers-2e31", "hf", "num_hidden_layers = 2^31 (must fail before per-layer work)",
          config(num_hidden_layers=BIG), expect=("num_hidden_layers|layers.2",), isolate=True),
        C("hf-hidden-size-true", "hf", "hidden_size = true", config(hidden_size=True), expect=("hidden_size",)),
        C("hf-intermediate-size-missing", "hf", "intermediate_size removed", config(intermediate_size=_ABSENT),
          expect=("intermediate_size",)),
        C("hf-head-dim-negative", "hf", "head_dim = -24", config(head_dim=-24), expect=("head_dim",)),
        C("hf-max-position-negative", "hf", "max_position_embeddings = -1", config(max_position_embeddings=-1),
          expect=("max_position_embeddings|context_length",)),
        C("hf-rope-theta-string", "hf", "rope_theta = '10000'", config(rope_theta="10000"), expect=("rope_theta",)),
        C("hf-rope-theta-nan", "hf", "rope_theta = NaN", config(rope_theta=NAN), expect=("rope_theta",)),
        C("hf-rms-eps-negative", "hf", "rms_norm_eps = -1e-5", config(rms_norm_eps=-1e-5),
          expect=("rms",)),
        C("hf-rms-eps-nan", "hf", "rms_norm_eps = NaN", config(rms_norm_eps=NAN), expect=("rms",)),
        C("hf-architectures-int", "hf", "architectures = 5", config(architectures=5), expect=("architectures",)),
        C("hf-architectures-unknown", "hf", "architectures = ['FooForCausalLM']",
          config(architectures=["FooForCausalLM"]), expect=("FooForCausalLM",)),
        C("hf-rope-scaling-type-array", "hf", "rope_scaling = {type: ['linear'], factor: 2}",
          config(rope_scaling={"type": ["linear"], "factor": 2.0}), expect=("rope_scaling|type",)),
        C("hf-rope-scaling-string", "hf", "rope_scaling = 'linear' (a string)", config(rope_scaling="linear"),
          expect=("rope_scaling",)),
        C("hf-rope-scaling-factor-nan", "hf", "rope_scaling = {type: 'linear', factor: NaN}",
          config(rope_scaling={"type": "linear", "factor": NAN}), expect=("factor",)),
        C("hf-rope-llama3-no-factor", "hf", "rope_scaling = {rope_type: 'llama3'} without its factor",
          config(rope_scaling={"rope_type": "llama3"}), expect=("factor",)),
        C("hf-text-config-string", "hf", "text_config = 'x'", config(text_config="x"), expect=("text_config",)),
        C("hf-config-not-object", "hf", "config.json = [1, 2]", json_file("config.json", [1, 2]),
          expect=("config.json",)),
        C("hf-config-not-json", "hf", "config.json is not JSON", raw_file("config.json", b"{'a': 1,"),
          expect=("config.json",)),
        C("hf-config-deep-nesting", "hf", "config.json nests arrays 100,000 deep",
          raw_file("config.json", _deep_json(100_000)), expect=("config.json",)),
        C("hf-config-is-fifo", "hf", "config.json is a FIFO", post=replace_with_fifo("config.json"),
          expect=("config.json",), isolate=True),
        C("hf-config-is-directory", "hf", "config.json is a directory", post=replace_with_dir("config.json"),
          expect=("config.json",)),

        # ---- Hugging Face tokenizer files ------------------------------------------------------------------
        C("hf-tokenizer-config-number", "hf", "tokenizer_config.json = 42", json_file("tokenizer_config.json", 42),
          expect=("tokenizer_config.json",)),
        C("hf-chat-template-number", "hf", "tokenizer_config.json chat_template = 5",
          json_edit("tokenizer_config.json", lambda t: t.update(chat_template=5)), expect=("chat_template",)),
        C("hf-chat-template-huge-string", "hf", "tokenizer_config.json chat_template = {{ 'a' * 3000000000 }}",
          json_edit("tokenizer_config.json", lambda t: t.update(chat_template=_HUGE_MUL)),
          expect=("chat_template",), isolate=True),
        C("hf-chat-template-jinja-fifo", "hf", "no chat_template in tokenizer_config.json, chat_template.jinja a FIFO",
          json_edit("tokenizer_config.json", lambda t: t.pop("chat_template")),
          post=replace_with_fifo("chat_template.jinja"), expect=("chat_template.jinja",), isolate=True),
        C("hf-tokenizer-json-not-json", "hf", "tokenizer.json is not JSON", raw_file("tokenizer.json", b"{"),
          expect=("tokenizer.json",)),
        C("hf-tokenizer-json-array", "hf", "tokenizer.json = []", json_file("tokenizer.json", []),
          expect=("tokenizer.json",)),
        C("hf-tokenizer-json-panic", "hf",
          "tokenizer.json normalizer Precompiled with an invalid charsmap (the tokenizers library panics)",
          json_edit("tokenizer.json", lambda t: t.update(normalizer={"type": "Precompiled",
                                                                     "precompiled_charsmap": "!!"})),
          expect=("tokenizer.json",), isolate=True),
        C("hf-tokenizer-vocab-id-1e8", "hf", "tokenizer.json vocabulary has a token with id 10^8",
          _tok_model(lambda mdl: mdl["vocab"].update({"zzzz": 100_000_000})), expect=("100000000|vocab",),
          isolate=True),
        C("hf-tokenizer-added-token-past-embedding", "hf",
          "tokenizer.json added token 'hi' (the prompt) with id 5000, past the 300 embedding rows",
          json_edit("tokenizer.json", _added_hi), expect=("5000|5001", "300")),
        C("hf-tokenizer-merges-unknown", "hf", "tokenizer.json merges name tokens not in the vocabulary",
          _tok_model(lambda mdl: mdl["merges"].insert(0, ["zq", "xj"])), expect=("tokenizer.json",)),

        # ---- Hugging Face tensors: accepted but wrong --------------------------------------------------------
        C("hf-q-proj-48x96", "hf", "model.layers.0.self_attn.q_proj.weight is 48x96 where 96x96 is due",
          st_tensor("model.layers.0.self_attn.q_proj.weight", shape=[48, 96], data=_bf16(48 * 96)),
          expect=("q_proj",)),
        C("hf-norm-zero-length", "hf", "model.layers.0.input_layernorm.weight has 0 elements",
          st_tensor("model.layers.0.input_layernorm.weight", shape=[0], data=b""), expect=("input_layernorm",)),
        C("hf-tensor-missing", "hf", "model.layers.1.mlp.down_proj.weight removed",
          drop_st("model.layers.1.mlp.down_proj.weight"), expect=("down_proj",)),
        C("hf-embed-1d", "hf", "model.embed_tokens.weight is 1-D",
          st_tensor("model.embed_tokens.weight", shape=lambda t: [300 * 96]), expect=("embed_tokens",)),
        C("hf-dtype-int8", "hf", "model.layers.0.mlp.up_proj.weight has dtype I8",
          st_tensor("model.layers.0.mlp.up_proj.weight", dtype="I8", data=lambda t: t.data[:len(t.data) // 2]),
          expect=("up_proj",)),
        C("hf-dtype-unknown", "hf", "model.layers.0.mlp.up_proj.weight has dtype 'Q4'",
          st_tensor("model.layers.0.mlp.up_proj.weight", dtype="Q4"), expect=("up_proj",)),

        # ---- safetensors headers the format forbids -----------------------------------------------------------
        C("st-overlap", "hf", "model.norm.weight's data_offsets are another tensor's (overlapping tensors)",
          _st_overlap, expect=("overlap",)),
        C("st-gap", "hf", "8 unused bytes between two tensors' data", st_tensor("model.norm.weight", gap=8),
          expect=("model.norm.weight|gap",)),
        C("st-trailing-bytes", "hf", "16 bytes after the last tensor", st_file(trailing=b"\0" * 16),
          expect=("trailing|bytes",)),
        C("st-dim-true", "hf", "model.norm.weight's shape is [true, 96]",
          st_tensor("model.norm.weight", shape=[True, 96]), expect=("model.norm.weight",)),
        C("st-metadata-list", "hf", "__metadata__ = ['pt'] (the format wants a string-to-string object)",
          st_file(metadata=["pt"]), expect=("__metadata__",)),
        C("st-metadata-values-not-strings", "hf", "__metadata__ = {format: 1}", st_file(metadata={"format": 1}),
          expect=("__metadata__",)),
        C("st-offsets-reversed", "hf", "model.norm.weight's data_offsets [end, begin]",
          st_tensor("model.norm.weight", reoffset=lambda t: lambda offs, real: offs[::-1]),
          expect=("model.norm.weight",)),
        C("st-offsets-float", "hf", "model.norm.weight's data_offsets are floats",
          st_tensor("model.norm.weight", offsets=[0.0, 192.0]), expect=("model.norm.weight",)),
        C("st-header-huge", "hf", "the header length is 2^60", post=lambda p, d: _patch(
            os.path.join(p, "model.safetensors"), 0, struct.pack("<Q", 1 << 60)), expect=("header",)),
        C("st-truncated", "hf", "model.safetensors cut at 70%",
          post=lambda p, d: truncate(0.7)(os.path.join(p, "model.safetensors"), d), expect=("truncated",)),
        C("st-shard-is-fifo", "hf", "model.safetensors is a FIFO", post=replace_with_fifo("model.safetensors"),
          expect=("model.safetensors",), isolate=True),
        C("st-shard-is-directory", "hf", "model.safetensors is a directory",
          post=replace_with_dir("model.safetensors"), expect=("model.safetensors",)),

        # ---- index files and paths ------------------------------------------------------------------------
        C("idx-weight-map-ints", "hf-sharded", "weight_map values are ints", weight_map(lambda k, v: 1),
          expect=("weight_map",)),
        C("idx-weight-map-list", "hf-sharded", "weight_map = [...] (a list)",
          json_edit("model.safetensors.index.json", lambda i: i.update(weight_map=list(i["weight_map"]))),
          expect=("weight_map", "object|list")),
        C("idx-not-json", "hf-sharded", "model.safetensors.index.json is not JSON",
          raw_file("model.safetensors.index.json", b"{"), expect=("index",)),
        C("idx-dotdot", "hf-sharded", "weight_map names ../secret.safetensors (a file outside the folder)",
          post=_index_points_out(rel=True), expect=("weight_map|secret.safetensors",)),
        C("idx-absolute", "hf-sharded", "weight_map names an absolute path (a file outside the folder)",
          post=_index_points_out(rel=False), expect=("weight_map|secret.safetensors",)),
        C("idx-nul", "hf-sharded", "weight_map names a file with a NUL character",
          weight_map(lambda k, v: v.replace("model", "mo\0del")), expect=("weight_map|model",)),
        C("idx-missing-shard", "hf-sharded", "a shard listed in the index is missing",
          shard_edit(lambda m, s: m.st.pop(s)), expect=("missing",)),
        C("idx-shard-symlink-escapes", "hf-sharded", "a shard is a symlink to a file outside the folder",
          post=shard_post(_symlink_out), expect=("symlink|outside",)),
        C("idx-shard-is-fifo", "hf-sharded", "a shard is a FIFO",
          post=shard_post(lambda p, s, d: replace_with_fifo(s)(p, d)), expect=("safetensors",), isolate=True),
        C("idx-shard-is-directory", "hf-sharded", "a shard is a directory",
          post=shard_post(lambda p, s, d: replace_with_dir(s)(p, d)), expect=("safetensors",)),
        C("idx-tensor-twice", "hf-sharded", "model.norm.weight stored in two shards",
          shard_edit(lambda m, s: m.st[s].tensors.append(copy.deepcopy(m.find("model.norm.weight")[1]))),
          expect=("model.norm.weight",)),
    ]
    names = [c.name for c in out]
    assert len(names) == len(set(names)), "duplicate case names"
    return out


def _patch(path: str, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


CASES: list[Case] = _cases()


def write_corpus(root: str, cases: list[Case] | None = None) -> dict[str, str]:
    """Write every case (or `cases`) under root; return {case name: --model path}."""
    os.makedirs(root, exist_ok=True)
    bases = Bases(root)
    return {c.name: write_case(c, root, bases) for c in (cases if cases is not None else CASES)}


# ======================================================================================================
# running the CLI on a case


@dataclass
class Outcome:
    rc: int | None                     # None: timed out
    stdout: str
    stderr: str
    seconds: float

    @property
    def lines(self) -> list[str]:
        return [ln for ln in self.stderr.splitlines() if ln.strip()]


def cli_argv(case: Case, path: str, verbose: bool = False) -> list[str]:
    return ["run", "--model", path, "-n", "2", *case.args, *(["--verbose"] if verbose else []), "hi"]


def cli_env() -> dict:
    return {**os.environ, "SHADERLM_TUNE": "0", "PYTHONUNBUFFERED": "1"}


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_subprocess(case: Case, path: str, timeout: float = TIMEOUT, verbose: bool = False) -> Outcome:
    """`python -m shaderlm run ...` on the case, under a memory limit and a timeout (rc None: timed out)."""
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "shaderlm", *cli_argv(case, path, verbose)], stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env(), cwd=_ROOT,
                         preexec_fn=_limit_memory, start_new_session=True)   # a timeout kills its whole group
    try:
        out, err = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        rc = None
    return Outcome(rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), time.perf_counter() - t0)


def problems(case: Case, path: str, o: Outcome, timeout: float = TIMEOUT) -> list[str]:
    """What is wrong with an outcome (empty: the case passes)."""
    if o.rc is None:
        return [f"TIMEOUT after {timeout:g} s (stderr so far: {o.stderr[-300:]!r})"]
    out = []
    if o.rc == 0:
        out.append(f"exit code 0 (stdout {o.stdout[-200:]!r})")
    elif o.rc < 0:
        out.append(f"killed by signal {-o.rc}")
    lines = o.lines
    if "Traceback" in o.stderr or "panicked at" in o.stderr:     # Rust's own panic report
        out.append("a traceback / panic on stderr")
    if len(lines) != 1:
        out.append(f"{len(lines)} lines on stderr, not 1")
    if not lines or not lines[-1].startswith("shaderlm: error:"):
        out.append("the last stderr line does not start with 'shaderlm: error:'")
    elif len(lines) == 1:
        line = lines[0].lower()
        if line.startswith("shaderlm: error: internal error"):
            out.append("the CLI's catch-all for an unexpected exception answered, not a check")
        if line.startswith("shaderlm: error: out of memory ("):
            out.append("the CLI's catch-all for MemoryError answered: the work was not bounded")
        if case.names_file and case.name.lower() not in line:
            out.append("the error line does not name the model file")
        text = line.replace(case.name.lower(), "")     # the words must be in the message, not in the path
        for want in case.expect:
            if not any(w.lower() in text for w in want.split("|")):
                out.append(f"the error line lacks {want!r}")
    return out


def tail(o: Outcome, n: int = 3) -> str:
    lines = o.lines
    return " / ".join(lines[-n:]) if lines else "(stderr empty)"


def raised_where(case: Case, path: str, timeout: float = TIMEOUT) -> str:
    """For an unexpected exception: its type and the innermost shaderlm frame, from a --verbose run."""
    o = run_subprocess(case, path, timeout, verbose=True)
    frames = [ln.strip() for ln in o.stderr.splitlines() if ln.strip().startswith("File ")]
    ours = [f for f in frames if "/shaderlm/" in f] or frames
    exc = [ln for ln in o.stderr.splitlines() if ln and not ln.startswith((" ", "Traceback", "shaderlm:"))]
    return f"{exc[-1] if exc else '?'} at {ours[-1] if ours else '?'}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir", nargs="?")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--run", action="store_true", help="run `shaderlm run --model CASE -n 2 hi` on each case")
    ap.add_argument("-k", default="", help="only cases whose name contains this")
    ap.add_argument("--jobs", "-j", type=int, default=2, help="subprocesses at once (default 2)")
    ap.add_argument("--timeout", type=float, default=TIMEOUT, help=f"seconds per case (default {TIMEOUT:g})")
    ap.add_argument("--where", action="store_true",
                    help="for an unexpected exception, run the case again with --verbose and say where it was raised")
    a = ap.parse_args(argv)
    cases = [c for c in CASES if a.k in c.name]
    if a.list:
        for c in cases:
            print(f"{c.name:42s} {c.change}")
        return 0
    if not a.outdir:
        ap.error("give OUTDIR (or --list)")
    paths = write_corpus(a.outdir, cases)
    print(f"wrote {len(paths)} cases under {a.outdir}", file=sys.stderr)
    if not a.run:
        return 0

    def one(c):
        o = run_subprocess(c, paths[c.name], a.timeout)
        bad = problems(c, paths[c.name], o, a.timeout)
        if a.where and o.rc is not None and ("internal error" in o.stderr or "Traceback" in o.stderr):
            bad.append("raised: " + raised_where(c, paths[c.name], a.timeout))
        return c, o, bad

    failed = 0
    with ThreadPoolExecutor(a.jobs) as ex:
        for c, o, bad in ex.map(one, cases):
            failed += bool(bad)
            status = "PASS" if not bad else ("TIMEOUT" if o.rc is None else "FAIL")
            print(f"{status:7s} {c.name:42s} rc={o.rc} {o.seconds:5.1f}s  {tail(o)}")
            if bad:
                print(f"        {'; '.join(bad)}")
    print(f"{len(cases) - failed} of {len(cases)} pass", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
