"""GGUF loading: config of real models, tensor views, synthetic files, and clear errors on broken files."""
from __future__ import annotations

import os
import struct

import numpy as np
import pytest

import gguf

from shaderlm.errors import ModelFormatError, ShaderLMError, UnsupportedError
from shaderlm.formats.gguf import GGUFFile
from shaderlm.models.loading import gguf_args
from shaderlm.models.transformer import SUPPORTED_TYPES
from shaderlm.synth import PRESETS, resolve, tensor_plan, write_synthetic_gguf
from shaderlm import synth


def config(path):
    """(architecture name, args) of a GGUF file, as the loader reads them."""
    cls, args = gguf_args(GGUFFile(path))
    return cls.gguf_arch, args


# ----------------------------------------------------------------------------------------------- real files


def test_supported_types():
    assert SUPPORTED_TYPES == ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K",
                               "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS", "MXFP4")


def test_smollm2_config(smollm2_path):
    f = GGUFFile(smollm2_path)
    assert f.arch == "llama"
    arch, c = config(smollm2_path)
    assert (arch, c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim) == ("llama", 30, 576, 9, 3, 64)
    assert (c.ffn_dim, c.vocab_size, c.context_length) == (1536, 49152, 8192)
    assert c.rope_base == 100000.0 and c.rope_dim == 64 and c.rope_neox is False and c.rope_scale == 1.0
    assert c.rms_eps == pytest.approx(1e-5)
    assert c.tied is True and "rope_freqs.weight" not in f.tensors
    assert c.q_dim == 576 and c.kv_dim == 192


def test_smollm2_tensors_and_metadata(smollm2_path):
    f = GGUFFile(smollm2_path)
    assert len(f.tensors) == 272
    emb = f.tensors["token_embd.weight"]
    assert (emb.type, emb.shape) == ("Q8_0", (49152, 576))
    assert emb.n_bytes == 49152 * 576 // 32 * 34
    for name, shape in [("blk.0.attn_q.weight", (576, 576)), ("blk.0.attn_k.weight", (192, 576)),
                        ("blk.0.attn_v.weight", (192, 576)), ("blk.0.attn_output.weight", (576, 576)),
                        ("blk.0.ffn_gate.weight", (1536, 576)), ("blk.0.ffn_up.weight", (1536, 576)),
                        ("blk.0.ffn_down.weight", (576, 1536))]:
        t = f.tensors[name]
        assert (t.type, t.shape) == ("Q4_1", shape), name
        assert t.n_bytes == shape[0] * shape[1] // 32 * 20
    norm = f.tensors["blk.29.ffn_norm.weight"]
    assert (norm.type, norm.shape, norm.n_bytes) == ("F32", (576,), 2304)
    assert "output.weight" not in f.tensors
    # tensor data are views into the read-only map, not copies
    for t in f.tensors.values():
        assert t.data.dtype == np.uint8 and t.data.shape == (t.n_bytes,)
        assert not t.data.flags.writeable and not t.data.flags.owndata
        assert t.offset % f.alignment == 0 and t.offset + t.n_bytes <= f.file_size
    with open(smollm2_path, "rb") as fh:
        fh.seek(norm.offset)
        assert fh.read(64) == norm.data[:64].tobytes()
    m = f.metadata
    assert isinstance(m["tokenizer.ggml.tokens"], list) and len(m["tokenizer.ggml.tokens"]) == 49152
    assert m["tokenizer.ggml.tokens"][:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert isinstance(m["tokenizer.ggml.token_type"], np.ndarray) and m["tokenizer.ggml.token_type"].dtype == np.int32
    assert m["tokenizer.ggml.merges"][0] == "Ġ t" and len(m["tokenizer.ggml.merges"]) == 48900
    assert m["tokenizer.ggml.bos_token_id"] == 1 and m["tokenizer.ggml.add_bos_token"] is False
    assert f.get("general.languages") == ["en"] and f.get("nope", 7) == 7
    assert "<|im_start|>" in f.require("tokenizer.chat_template")
    w = norm.dequantize()
    assert w.dtype == np.float32 and w.shape == (576,) and np.isfinite(w).all()


def test_gemma3_config(gemma3_path):
    arch, c = config(gemma3_path)
    assert (arch, c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim) == ("gemma3", 18, 640, 4, 1, 256)
    assert (c.ffn_dim, c.vocab_size, c.context_length) == (2048, 262144, 32768)
    assert c.rope_neox is True and c.rope_base == 1e6 and c.rms_eps == pytest.approx(1e-6)
    assert c.sliding_window == 512 and c.rope_base_local == 10000.0
    assert c.swa_layers == [(i % 6) != 5 for i in range(18)]
    assert c.qk_norm and c.tied and c.attn_scale == pytest.approx(1 / 16)


# ------------------------------------------------------------------------------------------ synthetic files


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_synthetic_tiny_roundtrip(synth_gguf, arch):
    path = synth_gguf(preset="tiny", arch=arch)
    f = GGUFFile(path)
    got, c = config(path)
    p = PRESETS["tiny"]
    assert (got, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim, c.vocab_size) == \
        (arch, p["dim"], p["n_heads"], p["n_kv_heads"], p["head_dim"], p["ffn_dim"], p["vocab_size"])
    assert c.rope_neox == (arch != "llama")
    assert c.attn_bias == (arch == "qwen2")
    assert c.qk_norm == (arch in ("qwen3", "gemma3"))
    if arch == "gemma3":
        assert c.n_layers == 6 and c.swa_layers == [True] * 5 + [False]
    for t in f.tensors.values():
        w = t.dequantize()
        assert np.isfinite(w).all() and np.abs(w).max() > 0, t.name
        if len(t.shape) == 2:
            assert 0.015 < w.std() < 0.15, (t.name, w.std())
        elif "norm" in t.name:
            assert 0.75 < w.min() and w.max() < 1.25


@pytest.mark.parametrize("quant", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                                   "Q4_K", "Q5_K", "Q6_K", "Q4_K_M"])
def test_synthetic_types(synth_gguf, quant):
    f = GGUFFile(synth_gguf(preset="tiny-k", quant=quant))
    types = {t.type for t in f.tensors.values() if len(t.shape) == 2}
    if quant == "Q4_K_M":
        assert types == {"Q4_K", "Q6_K"}
    else:
        assert quant in types
    for t in f.tensors.values():
        if len(t.shape) == 2:
            w = t.dequantize()
            assert np.isfinite(w).all() and 0.015 < w.std() < 0.15, (t.name, t.type, w.std())


def test_q4_k_m_benchmark_layout():
    # issue 3's yardstick files: Q6_K attn_v/ffn_down/output/token_embd everywhere, Q4_K elsewhere
    plan = {name: (shape, t) for name, shape, t in tensor_plan(resolve("llama-3.1-8b"), "Q4_K_M", None)}
    assert {plan[f"blk.{i}.attn_v.weight"][1] for i in range(32)} == {"Q6_K"}
    assert {plan[f"blk.{i}.ffn_down.weight"][1] for i in range(32)} == {"Q6_K"}
    assert {plan[f"blk.{i}.ffn_up.weight"][1] for i in range(32)} == {"Q4_K"}
    assert plan["token_embd.weight"][1] == plan["output.weight"][1] == "Q6_K"
    size = sum(synth._n_bytes(s, t) for s, t in plan.values())
    assert 5.25e9 < size < 5.35e9                                 # the yardstick's 5.30 GB per token


def test_q4_k_m_plan_follows_llama_cpp():
    plan = {name: (shape, t) for name, shape, t in tensor_plan(resolve("llama-3.1-8b"), "Q4_K_M_LCPP", None)}
    counts = {}
    for _, t in plan.values():
        counts[t] = counts.get(t, 0) + 1
    assert counts == {"Q4_K": 193, "Q6_K": 33, "F32": 66}        # as llama.cpp's Llama-3.1-8B Q4_K_M
    assert plan["token_embd.weight"] == ((128256, 4096), "Q4_K")
    assert plan["output.weight"] == ((128256, 4096), "Q6_K")
    assert plan["blk.0.attn_v.weight"][1] == "Q6_K" and plan["blk.4.attn_v.weight"][1] == "Q4_K"
    assert plan["blk.31.ffn_down.weight"] == ((4096, 14336), "Q6_K")
    size = sum(synth._n_bytes(s, t) for s, t in plan.values())
    assert 4.85e9 < size < 4.95e9
    # rows that are not a multiple of 256 get llama.cpp's fallbacks; a tied embedding is the output: Q6_K
    plan = {name: t for name, _, t in tensor_plan(resolve("smollm2-135m"), "Q4_K_M_LCPP", None)}
    assert plan["blk.0.attn_q.weight"] == "Q5_0" and plan["blk.0.ffn_down.weight"] == "Q6_K"
    assert plan["blk.0.attn_v.weight"] == "Q8_0" and plan["token_embd.weight"] == "Q8_0"


def test_synthetic_tokenizer_is_valid_bpe(tiny_gguf):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    m = GGUFFile(tiny_gguf).metadata
    assert m["tokenizer.ggml.model"] == "gpt2"
    tokens, merges = m["tokenizer.ggml.tokens"], m["tokenizer.ggml.merges"]
    assert len(tokens) == 300 == len(set(tokens)) and len(m["tokenizer.ggml.token_type"]) == 300
    vocab = {t: i for i, t in enumerate(tokens)}
    for mg in merges:
        a, b = mg.split(" ")
        assert a in vocab and b in vocab and a + b in vocab
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(mg.split(" ")) for mg in merges]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = "The quick brown fox, and the dog: naïve €42!"
    ids = tok.encode(text).ids
    assert len(ids) < len(text.encode()) and tok.decode(ids) == text
    assert tokens[m["tokenizer.ggml.eos_token_id"]] == "<|im_end|>"


def test_synthetic_overrides_and_errors(tmp_path):
    p = write_synthetic_gguf(tmp_path / "o.gguf", preset="tiny", n_layers=1, vocab_size=2000, tied=True,
                             quant="Q8_0", embed_type="F16")
    f = GGUFFile(p)
    _, c = config(p)
    assert c.n_layers == 1 and c.vocab_size == 2000 and c.tied
    assert f.tensors["token_embd.weight"].type == "F16" and f.tensors["blk.0.attn_q.weight"].type == "Q8_0"
    assert f.metadata["tokenizer.ggml.tokens"][-1].startswith("<|pad_")
    # padding tokens are text (a random model picks them, and a server streams what it picks)
    from shaderlm.formats.tokenizer import Tokenizer
    tok = Tokenizer.from_metadata(f.metadata)
    assert tok.token_to_bytes(1999) == f.metadata["tokenizer.ggml.tokens"][1999].encode()
    with pytest.raises(TypeError, match="bogus"):
        write_synthetic_gguf(tmp_path / "x.gguf", bogus=1)
    with pytest.raises(ValueError, match="preset"):
        write_synthetic_gguf(tmp_path / "x.gguf", preset="nope")
    with pytest.raises(ValueError, match="quant"):
        write_synthetic_gguf(tmp_path / "x.gguf", quant="IQ2_XXS")


def test_synthetic_is_deterministic(tmp_path):
    a = write_synthetic_gguf(tmp_path / "a.gguf", seed=3)
    b = write_synthetic_gguf(tmp_path / "b.gguf", seed=3)
    c = write_synthetic_gguf(tmp_path / "c.gguf", seed=4)
    ra, rb, rc = (open(x, "rb").read() for x in (a, b, c))
    assert ra == rb and ra != rc


def test_synth_cli(tmp_path, capsys):
    out = tmp_path / "cli.gguf"
    assert synth.main(["--preset", "tiny", "--arch", "qwen3", "--quant", "Q5_0", "--set", "n_layers=3",
                       "--out", str(out)]) == 0
    arch, c = config(out)
    assert arch == "qwen3" and c.n_layers == 3
    assert "wrote" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- broken files


def _copy(src, dst, n_bytes=None, patch: dict[int, bytes] | None = None) -> str:
    data = bytearray(open(src, "rb").read())
    if n_bytes is not None:
        data = data[:n_bytes]
    for off, b in (patch or {}).items():
        data[off:off + len(b)] = b
    with open(dst, "wb") as fh:
        fh.write(data)
    return str(dst)


@pytest.fixture(scope="module")
def layout(tiny_gguf):
    """Offsets of the parts of the tiny file, from gguf-py's own reader."""
    r = gguf.GGUFReader(tiny_gguf)
    kv_start = r.fields["general.architecture"].offset
    tokens = r.fields["tokenizer.ggml.tokens"]
    ti_start = r.tensors[0].field.offset
    last = r.tensors[-1]
    return dict(size=os.path.getsize(tiny_gguf), kv_start=kv_start, tokens=tokens.offset, ti_start=ti_start,
                data_start=r.data_offset, tensors=r.tensors, last=last)


@pytest.mark.parametrize("where", ["magic", "header", "kv_key", "kv_tokens", "tensor_info", "first_tensor_data",
                                   "last_tensor_data"])
def test_truncated(tiny_gguf, layout, tmp_path, where):
    cut = {
        "magic": 3,
        "header": 13,
        "kv_key": layout["kv_start"] + 5,
        "kv_tokens": layout["tokens"] + 500,
        "tensor_info": layout["ti_start"] + 30,
        "first_tensor_data": layout["data_start"] + 10,
        "last_tensor_data": layout["last"].data_offset + layout["last"].n_bytes - 1,
    }[where]
    path = _copy(tiny_gguf, tmp_path / "cut.gguf", cut)
    with pytest.raises(ModelFormatError) as ei:
        GGUFFile(path)
    msg = str(ei.value)
    assert path in msg
    if where == "magic":
        assert "not a GGUF file" in msg
        return
    assert "truncated" in msg and f"{cut:,} bytes" in msg
    if where == "kv_tokens":
        assert "tokenizer.ggml.tokens" in msg
    if where == "tensor_info":
        assert layout["tensors"][0].name in msg
    if where == "first_tensor_data":
        assert layout["tensors"][0].name in msg
    if where == "last_tensor_data":
        t = layout["last"]
        assert t.name in msg and f"{t.n_bytes:,}" in msg


def test_truncated_everywhere(tiny_gguf, layout, tmp_path):
    # every cut inside the file's structure or data is reported as a ModelFormatError saying "truncated"
    end = layout["last"].data_offset + layout["last"].n_bytes
    for cut in list(range(0, 64, 7)) + list(range(64, end, max(1, end // 97))) + [end - 1]:
        path = _copy(tiny_gguf, tmp_path / "cut.gguf", cut)
        with pytest.raises(ModelFormatError, match="truncated|not a GGUF file"):
            GGUFFile(path)
    # the padding after the last tensor is not needed
    GGUFFile(_copy(tiny_gguf, tmp_path / "cut.gguf", end))


def test_bad_magic_and_version(tiny_gguf, tmp_path):
    with pytest.raises(ModelFormatError, match=r"not a GGUF file: bad magic b'GGUX'"):
        GGUFFile(_copy(tiny_gguf, tmp_path / "m.gguf", patch={0: b"GGUX"}))
    txt = tmp_path / "notes.txt"
    txt.write_text("hello, this is not a model\n" * 3)
    with pytest.raises(ModelFormatError, match="not a GGUF file"):
        GGUFFile(txt)
    zipf = tmp_path / "model.bin"
    zipf.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(ModelFormatError, match="PyTorch"):
        GGUFFile(zipf)
    with pytest.raises(ModelFormatError, match="unsupported GGUF version 7"):
        GGUFFile(_copy(tiny_gguf, tmp_path / "v.gguf", patch={4: struct.pack("<I", 7)}))
    with pytest.raises(ModelFormatError, match="no such file"):
        GGUFFile(tmp_path / "missing.gguf")
    with pytest.raises(ModelFormatError, match="directory"):
        GGUFFile(tmp_path)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ModelFormatError, match="not a GGUF file"):
        GGUFFile(empty)


def _type_field_offset(t) -> int:
    name_len, name, n_dims, dims, raw_dtype, _ = t.field.parts
    return t.field.offset + 8 + len(bytes(name)) + 4 + 8 * int(n_dims[0])


@pytest.mark.parametrize("type_id,expect", [(999, "unknown ggml type id 999"), (18, "type IQ3_XXS"),
                                            (16, "type IQ2_XXS")])
def test_unsupported_tensor_type(tiny_gguf, layout, tmp_path, type_id, expect):
    t = layout["tensors"][3]
    off = _type_field_offset(t)
    assert struct.unpack_from("<I", open(tiny_gguf, "rb").read(off + 4), off)[0] == int(t.tensor_type)
    path = _copy(tiny_gguf, tmp_path / "t.gguf", patch={off: struct.pack("<I", type_id)})
    with pytest.raises(UnsupportedError) as ei:
        GGUFFile(path, types=SUPPORTED_TYPES)
    msg = str(ei.value)
    assert expect in msg and f"'{t.name}'" in msg and path in msg and "Q4_K" in msg


def _minimal(path, arch="llama", skip=(), tensor=True, kv=None) -> str:
    w = gguf.GGUFWriter(str(path), arch)
    kv = {f"{arch}.block_count": 1, f"{arch}.embedding_length": 32, f"{arch}.attention.head_count": 4,
          f"{arch}.context_length": 64, f"{arch}.feed_forward_length": 64, **(kv or {})}
    for k, v in kv.items():
        if k not in skip:
            w.add_uint32(k, v)
    if tensor:
        w.add_tensor("token_embd.weight", np.ones((10, 32), dtype=np.float32))
        w.add_tensor("blk.0.attn_norm.weight", np.ones(32, dtype=np.float32))   # the block count's one layer
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def test_missing_required_key(tmp_path):
    path = _minimal(tmp_path / "k.gguf", skip=("llama.block_count",))
    f = GGUFFile(path)
    with pytest.raises(ModelFormatError) as ei:
        config(path)
    assert "'llama.block_count'" in str(ei.value) and path in str(ei.value)
    with pytest.raises(ModelFormatError, match="'general.nothing'"):
        f.require("general.nothing")
    with pytest.raises(ModelFormatError, match="'output.weight'"):
        f.tensor("output.weight")
    # a minimal but complete file works, vocab from token_embd rows
    _, c = config(_minimal(tmp_path / "ok.gguf"))
    assert (c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab_size) == (1, 32, 4, 4, 8, 10)
    # the block count is bounded by the layers that have tensors (a huge count fails before any loop)
    with pytest.raises(ModelFormatError, match=r"'llama.block_count' is 2, but the tensors are there for 1 layers"):
        config(_minimal(tmp_path / "two.gguf", kv={"llama.block_count": 2}))


def test_unsupported_arch(tmp_path):
    path = _minimal(tmp_path / "a.gguf", arch="mamba")
    f = GGUFFile(path)
    assert f.arch == "mamba"
    with pytest.raises(UnsupportedError) as ei:
        config(path)
    msg = str(ei.value)
    assert "'mamba'" in msg and all(a in msg for a in ("llama", "qwen2", "qwen3", "gemma3", "phi3"))


def test_missing_architecture(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "n.gguf"), "llama")
    del w.kv_data[0]["general.architecture"]
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFormatError, match="'general.architecture'"):
        GGUFFile(tmp_path / "n.gguf")


def test_corrupt_header_bytes_never_leak_raw_errors(tiny_gguf, layout, tmp_path):
    """Random byte corruption of the header/metadata/tensor infos: a ShaderLMError or a usable file."""
    rng = np.random.default_rng(0)
    src = bytearray(open(tiny_gguf, "rb").read())
    path = tmp_path / "fuzz.gguf"
    hot = [8, 16, layout["kv_start"], layout["tokens"], layout["ti_start"]]
    for i in range(150):
        data = bytearray(src)
        base = hot[i % len(hot)] if i % 3 else int(rng.integers(0, layout["data_start"]))
        for _ in range(int(rng.integers(1, 4))):
            off = min(base + int(rng.integers(0, 24)), len(data) - 1)
            data[off] = int(rng.integers(0, 256))
        path.write_bytes(bytes(data))
        try:
            config(path)
        except ShaderLMError:
            pass


@pytest.mark.parametrize("arch,neox", [("qwen2", True), ("qwen3", True), ("phi3", True), ("llama", False)])
def test_minimal_config_per_arch(tmp_path, arch, neox):
    got, c = config(_minimal(tmp_path / f"{arch}.gguf", arch=arch))
    assert got == arch and c.rope_neox is neox and c.rope_base == 10000.0 and c.rope_dim == c.head_dim == 8
    assert c.tied and c.ffn_dim == 64 and c.context_length == 64


def test_rope_scaling_keys(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "r.gguf"), "llama")
    for k, v in {"llama.block_count": 1, "llama.embedding_length": 32, "llama.attention.head_count": 4,
                 "llama.context_length": 64, "llama.feed_forward_length": 64}.items():
        w.add_uint32(k, v)
    w.add_string("llama.rope.scaling.type", "linear")
    w.add_float32("llama.rope.scaling.factor", 4.0)
    w.add_tensor("token_embd.weight", np.ones((10, 32), dtype=np.float32))
    w.add_tensor("rope_freqs.weight", np.ones(4, dtype=np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(32, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _, c = config(tmp_path / "r.gguf")
    assert c.rope_scale == 4.0 and c.rope_scaling["type"] == "linear"
