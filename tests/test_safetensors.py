"""The safetensors reader against the reference library (safetensors, Rust): every file the reference
refuses we refuse with ModelFormatError (UnsupportedError for an unknown dtype) naming the problem, every
file it reads we read to the same bytes; random byte mutations of a valid file never disagree.  And a
Hugging Face folder's weight files: names confined to the folder, regular files only (a FIFO must not
hang the loader)."""
from __future__ import annotations

import json
import os
import signal
import struct
from contextlib import contextmanager

import numpy as np
import pytest

safetensors = pytest.importorskip("safetensors")
from safetensors import deserialize, safe_open  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

from shaderlm.errors import ModelFormatError, UnsupportedError  # noqa: E402
from shaderlm.formats.safetensors import SafetensorsFile  # noqa: E402
from shaderlm.models import open_model  # noqa: E402
from shaderlm.synth import write_synthetic_hf  # noqa: E402


def raw(header, data: bytes = b"", n: int | None = None) -> bytes:
    """A file's bytes: header (dict, or JSON text as written), then data; n overrides the header length."""
    if not isinstance(header, (str, bytes)):
        header = json.dumps(header)
    head = header.encode() if isinstance(header, str) else header
    return struct.pack("<Q", len(head) if n is None else n) + head + data


def T(dtype="F32", shape=(2,), offs=(0, 8)) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": offs}      # tuples: JSON arrays


def reference(path) -> dict:
    """name -> (dtype, shape, bytes) as the reference reads the file (it raises where it refuses it)."""
    with safe_open(path, framework="np"):
        pass
    with open(path, "rb") as f:
        return {k: (v["dtype"], tuple(v["shape"]), bytes(v["data"])) for k, v in deserialize(f.read())}


def ours(path) -> dict:
    st = SafetensorsFile(path)
    return {k: (t.dtype, t.shape, bytes(t.data)) for k, t in st.tensors.items()}


def put(tmp_path, data: bytes, name="x.safetensors") -> str:
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


# ---------------------------------------------------------------------------------------------------
# files both read


def test_valid_files_read_like_reference(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"f32": rng.standard_normal((3, 5)).astype(np.float32),
               "f16": rng.standard_normal(7).astype(np.float16),
               "f64": rng.standard_normal((2, 1, 2)),
               "i64": rng.integers(-9, 9, 4), "u8": rng.integers(0, 255, 9).astype(np.uint8),
               "i8": rng.integers(-9, 9, 3).astype(np.int8), "bool": rng.random(5) > 0.5,
               "empty": np.zeros((0, 4), np.float32), "empty16": np.zeros(0, np.float16),
               "scalar": np.array(2.5, np.float32)}
    p = str(tmp_path / "v.safetensors")
    save_file(tensors, p, metadata={"format": "pt", "note": "ünïcode"})
    assert ours(p) == reference(p)
    st = SafetensorsFile(p)
    assert st.metadata == {"format": "pt", "note": "ünïcode"}
    np.testing.assert_array_equal(st.tensors["f32"].to_numpy(), tensors["f32"])
    assert st.tensors["empty"].shape == (0, 4) and st.tensors["empty"].n_bytes == 0
    assert st.tensors["scalar"].shape == () and st.tensors["scalar"].to_numpy() == 2.5


def test_torch_dtypes_read_like_reference(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file as save_torch
    p = str(tmp_path / "t.safetensors")
    save_torch({"bf16": torch.randn(3, 4).bfloat16(), "f8": torch.randn(8).to(torch.float8_e4m3fn),
                "c64": torch.randn(2, dtype=torch.complex64), "i32": torch.arange(5, dtype=torch.int32)}, p)
    assert ours(p) == reference(p)
    assert SafetensorsFile(p).tensors["f8"].dtype == "F8_E4M3"


# what the reference accepts although a stricter reading of the spec might not: we must accept it too
ACCEPTED = {
    "empty header": raw({}),
    "only metadata": raw({"__metadata__": {"a": "b"}}),
    "null metadata": raw({"__metadata__": None, "a": T()}, bytes(8)),
    "whitespace around the JSON": raw(" \n{\"a\":%s}\t\r  " % json.dumps(T()), bytes(8)),
    "offsets out of name order": raw({"b": T(offs=(8, 16)), "a": T()}, bytes(16)),
    "zero-size tensors anywhere": raw({"z": T(shape=(0,), offs=(8, 8)), "a": T(), "y": T(shape=(0, 3), offs=(0, 0))},
                                      bytes(8)),
    "huge dimension times 0": raw({"a": T(shape=(2 ** 62, 0), offs=(0, 0))}),
    "unknown extra field": raw({"a": {**T(), "x": [1, {"y": -0}]}}, bytes(8)),
    "repeated extra field": raw('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1,"x":2}}', bytes(8)),
    "repeated identical tensor": raw('{"a":%s,"a":%s}' % (json.dumps(T()), json.dumps(T())), bytes(8)),
    "repeated metadata key": raw('{"__metadata__":{"k":"1","k":"2"}}'),
    "escapes in keys": raw('{"\\u005f_metadata__":{},"\\ud83d\\ude00":{"dt\\u0079pe":"F32","shape":[2],'
                           '"data_offsets":[0,8]}}', bytes(8)),
    "empty tensor name": raw({"": T()}, bytes(8)),
    "sub-byte dtype (F4)": raw({"a": T("F4", (2, 3), (0, 3))}, bytes(3)),
    "nesting 127 deep": raw('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":%s}}' % ("[" * 125 + "]" * 125),
                            bytes(8)),
    "tiny float": raw({"a": {**T(), "x": 1e-999}}, bytes(8)),
}


@pytest.mark.parametrize("case", list(ACCEPTED))
def test_accepted_like_reference(tmp_path, case):
    p = put(tmp_path, ACCEPTED[case])
    assert ours(p) == reference(p)


# ---------------------------------------------------------------------------------------------------
# files both refuse: (bytes, what our message says)

def _u64_text(field: str, value: str) -> bytes:
    text = json.dumps(T()).replace("[2]" if field == "shape" else "[0, 8]", value)
    return raw('{"a":%s}' % text, bytes(8))


REFUSED = {
    # framing
    "shorter than 8 bytes": (b"\x02\x00\x00\x00", "truncated"),
    "header length 0": (raw(b""), "header length 0"),
    "header length past the end": (raw({}, n=64), "the header needs 72 bytes"),
    "header length over 100 MB": (raw({}, n=100_000_001), "over the format's 100 MB limit"),
    "header length 2**63": (raw({}, n=2 ** 63), "over the format's 100 MB limit"),
    "trailing bytes": (raw({"a": T()}, bytes(9)), "1 bytes after the last tensor"),
    "data truncated": (raw({"a": T()}, bytes(7)), "truncated"),
    "padding not whitespace": (raw(b"{}\0\0\0\0\0\0"), "not JSON"),
    # JSON as serde_json reads it
    "not UTF-8": (raw(b'{"\xff":1}'), "not JSON"),
    "not JSON": (raw("{nop"), "not JSON"),
    "trailing comma": (raw('{"a":%s,}' % json.dumps(T()), bytes(8)), "not JSON"),
    "top level a list": (raw([]), "not a JSON object"),
    "NaN": (raw('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":NaN}}', bytes(8)), "NaN"),
    "number out of double range": (raw('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1e999}}',
                                       bytes(8)), "out of range"),
    "integer of 5000 digits": (raw('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":%s}}' % ("9" * 5000),
                                   bytes(8)), "out of range"),
    "lone surrogate escape": (raw('{"\\ud800":%s}' % json.dumps(T()), bytes(8)), "surrogate"),
    "lone surrogate in a replaced value": (raw('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],'
                                               '"x":["\\udc00"],"x":1}}', bytes(8)), "surrogate"),
    "nesting 128 deep": (raw('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":%s}}'
                             % ("[" * 126 + "]" * 126), bytes(8)), "nested more than 127"),
    "nesting 10000 deep": (raw('{"a":%s}' % ("[" * 10000 + "]" * 10000)), "not JSON"),
    # repeated keys
    "__metadata__ twice": (raw('{"__metadata__":{},"__metadata__":{}}'), "'__metadata__' twice"),
    "a field twice": (raw('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"dtype":"F32"}}', bytes(8)),
                      "repeats a field"),
    "a replaced tensor entry invalid": (raw('{"a":{"dtype":1},"a":%s}' % json.dumps(T()), bytes(8)), "'a'"),
    "a replaced metadata value not a string": (raw('{"__metadata__":{"k":1,"k":"v"}}'), "key 'k' is 1"),
    "the last of a repeated tensor misplaced": (raw('{"a":%s,"a":%s}' % (json.dumps(T()), json.dumps(T(offs=(8, 16)))),
                                                    bytes(16)), "gap of 8 bytes"),
    # __metadata__
    "metadata a list": (raw({"__metadata__": []}), r"'__metadata__' is \[\], not a JSON object"),
    "metadata a string": (raw({"__metadata__": "s"}), "not a JSON object"),
    "metadata value an int": (raw({"__metadata__": {"k": 1}}), "key 'k' is 1, not a string"),
    "metadata value null": (raw({"__metadata__": {"k": None}}), "not a string"),
    "metadata value an object": (raw({"__metadata__": {"k": {}}}), "not a string"),
    # entries
    "entry a string": (raw({"a": "x"}), "lacks dtype/shape/data_offsets"),
    "entry lacks data_offsets": (raw({"a": {"dtype": "F32", "shape": [2]}}, bytes(8)), "lacks"),
    "dtype null": (raw({"a": T(dtype=None)}, bytes(8)), "dtype None is not a string"),
    "dtype lowercase": (raw({"a": T(dtype="f32")}, bytes(8)), "unknown dtype 'f32'"),
    "shape true": (raw({"a": T(shape=(True, 2))}, bytes(8)), r"shape \[True, 2\]"),
    "shape false": (raw({"a": T(shape=(False,), offs=(0, 0))}), r"shape \[False\]"),
    "shape negative": (raw({"a": T(shape=(-2,))}, bytes(8)), "non-negative"),
    "shape -0": (_u64_text("shape", "[-0]"), "non-negative"),
    "shape 2.0": (_u64_text("shape", "[2.0]"), "non-negative"),
    "shape 2e0": (_u64_text("shape", "[2e0]"), "non-negative"),
    "shape 2**64": (_u64_text("shape", "[18446744073709551616]"), "non-negative"),
    "shape null": (raw({"a": T(shape=None)}, bytes(8)), "shape None"),
    "data_offsets true": (raw({"a": T(offs=(True, 9))}, bytes(9)), r"data_offsets \[True, 9\]"),
    "data_offsets negative": (raw({"a": T(offs=(-8, 0))}, bytes(8)), "data_offsets"),
    "data_offsets 3 long": (raw({"a": T(offs=(0, 8, 8))}, bytes(8)), "not \\[begin, end\\]"),
    "data_offsets an object": (raw({"a": T(offs={"0": 0, "1": 8})}, bytes(8)), "data_offsets"),
    "data_offsets float": (_u64_text("offs", "[0, 8.0]"), "data_offsets"),
    # sizes
    "size not shape x dtype": (raw({"a": T(offs=(0, 6))}, bytes(6)), "should hold 8 bytes"),
    "element count overflows": (raw({"a": T(shape=(2 ** 62, 8), offs=(0, 0))}), "overflows 64 bits"),
    "overflow before a 0 dimension": (raw({"a": T(shape=(2 ** 62, 8, 0), offs=(0, 0))}), "overflows 64 bits"),
    "bit count overflows": (raw({"a": T(shape=(2 ** 59,), offs=(0, 0))}), "overflows 64 bits"),
    "shape 2**64-1": (_u64_text("shape", "[18446744073709551615]"), "overflows 64 bits"),
    "sub-byte dtype not whole bytes": (raw({"a": T("F4", (3,), (0, 2))}, bytes(2)), "whole bytes"),
    "end offset 2**64-1": (_u64_text("offs", "[0, 18446744073709551615]"), "should hold 8 bytes"),
    # tiling
    "data not starting at 0": (raw({"a": T(offs=(1, 9))}, bytes(9)), "gap of 1 bytes"),
    "gap between tensors": (raw({"a": T(), "b": T(offs=(12, 20))}, bytes(20)), "'b'.*gap of 4 bytes"),
    "overlapping tensors": (raw({"a": T(), "b": T(offs=(4, 12))}, bytes(12)), "'b'.*overlap tensor 'a'"),
    "two tensors, same bytes": (raw({"a": T(), "b": T()}, bytes(8)), "overlap"),
    "end before begin": (raw({"a": T(offs=(8, 0))}, bytes(8)), "end before they begin"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_like_reference(tmp_path, case):
    data, message = REFUSED[case]
    p = put(tmp_path, data)
    with pytest.raises(Exception):
        reference(p)
    with pytest.raises(ModelFormatError, match=message) as e:
        SafetensorsFile(p)
    assert type(e.value) is ModelFormatError and p in str(e.value)


def test_unknown_dtype_is_unsupported(tmp_path):
    p = put(tmp_path, raw({"a": T(dtype="F12_E6M5")}, bytes(8)))
    with pytest.raises(Exception):
        reference(p)
    with pytest.raises(UnsupportedError, match=r"tensor 'a' has unknown dtype 'F12_E6M5'"):
        SafetensorsFile(p)


def test_stricter_than_reference(tmp_path):
    """Two spellings serde's derived parser takes and no writer makes; we refuse them (by choice)."""
    for header in ({"a": T(dtype={"F32": None})},                   # an enum as a one-key map
                   {"a": ["F32", [2], [0, 8]]}):                   # a struct as an array of its fields
        p = put(tmp_path, raw(header, bytes(8)))
        assert reference(p)["a"][0] == "F32"
        with pytest.raises(ModelFormatError, match="tensor 'a'"):
            SafetensorsFile(p)


def test_messages_stay_short(tmp_path):
    p = put(tmp_path, raw({"x" * 100_000: T(shape=list(range(10_000)))}, bytes(8)))
    with pytest.raises(ModelFormatError) as e:
        SafetensorsFile(p)
    assert len(str(e.value)) < 600


def test_random_mutations_agree_with_reference(tmp_path):
    """600 mutations of a valid file: bytes of the header replaced, inserted or deleted (the length
    prefix kept right, so that the JSON itself is tested), half random bytes, half JSON's own characters;
    or a byte of the length prefix or of the data replaced; or the file cut or extended.  We accept
    exactly what the reference accepts, to the same bytes, and refuse the rest with ModelFormatError or
    UnsupportedError only."""
    rng = np.random.default_rng(1234)
    p = str(tmp_path / "v.safetensors")
    save_file({"w": rng.standard_normal((3, 4)).astype(np.float32), "b": np.arange(3, dtype=np.int16),
               "e": np.zeros((0, 2), np.float16), "m": np.ones(2, np.uint8), "s": np.array(1.0)}, p,
              metadata={"format": "np"})
    base = open(p, "rb").read()
    n_head = 8 + struct.unpack("<Q", base[:8])[0]
    alphabet = b'0123456789 ,:[]{}"-.eE\\u_FINaNtruefalsenull\t'
    disagree, accepted = [], 0
    for i in range(600):
        b = bytearray(base)
        if i % 10 < 7:                                      # the header, its length prefix kept right
            head = b[8:n_head]
            for _ in range(rng.integers(1, 4)):
                at = int(rng.integers(0, len(head)))
                ch = int(rng.integers(0, 256)) if i % 2 else alphabet[rng.integers(0, len(alphabet))]
                op = rng.integers(0, 3)
                if op == 0:
                    head[at] = ch
                elif op == 1:
                    head.insert(at, ch)
                else:
                    del head[at]
            b = struct.pack("<Q", len(head)) + head + base[n_head:]
        elif i % 10 == 7:                                   # the length prefix
            b[rng.integers(0, 8)] = rng.integers(0, 256)
        elif i % 10 == 8:                                   # the data
            b[rng.integers(n_head, len(b))] = rng.integers(0, 256)
        else:                                               # cut or extended
            b = b[:rng.integers(0, len(b))] if i % 20 == 9 else b + bytes(int(rng.integers(1, 9)))
        q = put(tmp_path, bytes(b), "m.safetensors")
        try:
            theirs = reference(q)
        except Exception:
            theirs = None
        try:
            mine = ours(q)
        except (ModelFormatError, UnsupportedError):
            mine = None
        accepted += mine is not None
        if mine != theirs:
            disagree.append((i, bytes(b[:600]), theirs is not None))
    assert not disagree, disagree[:5]
    assert accepted >= 60, accepted                       # the data mutations at least


# ---------------------------------------------------------------------------------------------------
# Hugging Face folders: the weight files


@contextmanager
def deadline(seconds: int):
    """Fail instead of hanging (an open() of a FIFO blocks until a writer comes)."""
    def stop(*_):
        raise TimeoutError(f"still running after {seconds} s")
    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _sharded(tmp_path) -> tuple[str, str, dict]:
    folder = write_synthetic_hf(tmp_path / "m", arch="qwen2", preset="tiny", dtype="F16", shard_bytes=60_000)
    idx = os.path.join(folder, "model.safetensors.index.json")
    return folder, idx, json.load(open(idx))


def _point_index_at(idx: str, index: dict, name: str) -> None:
    wm = index["weight_map"]
    wm[next(iter(wm))] = name
    json.dump(index, open(idx, "w"))


SECRET = "top-secret-contents"


@pytest.mark.parametrize("kind", ["parent", "absolute", "subfolder", "dotdot", "symlink-out", "fifo", "directory",
                                  "missing"])
def test_index_names_confined_to_folder(tmp_path, kind):
    folder, idx, index = _sharded(tmp_path)
    outside = tmp_path / "outside.safetensors"
    outside.write_text(SECRET)
    name, message = {"parent": ("../outside.safetensors", "should be file names in the folder"),
                     "absolute": (str(outside), "should be file names in the folder"),
                     "subfolder": ("sub/x.safetensors", "should be file names in the folder"),
                     "dotdot": ("..", "should be file names in the folder"),
                     "symlink-out": ("link.safetensors", "'link.safetensors' .*links outside the folder"),
                     "fifo": ("fifo.safetensors", "'fifo.safetensors' .*not a regular file"),
                     "directory": ("x.safetensors", "'x.safetensors' .*not a regular file"),
                     "missing": ("gone.safetensors", "'gone.safetensors' .*index.json.* is missing")}[kind]
    if kind == "symlink-out":
        os.symlink(outside, os.path.join(folder, name))
    elif kind == "fifo":
        os.mkfifo(os.path.join(folder, name))
    elif kind == "directory":
        os.mkdir(os.path.join(folder, name))
    _point_index_at(idx, index, name)
    with deadline(20), pytest.raises(ModelFormatError, match=message) as e:
        open_model(folder)
    assert SECRET not in str(e.value)


def test_fifo_weights_and_index_refused_without_hanging(tmp_path):
    folder, idx, _ = _sharded(tmp_path)
    os.remove(idx)
    os.mkfifo(idx)
    with deadline(20):
        with pytest.raises(ModelFormatError, match="model.safetensors.index.json' .*not a regular file"):
            open_model(folder)
        os.remove(idx)
        for n in os.listdir(folder):
            if n.endswith(".safetensors"):
                os.remove(os.path.join(folder, n))
        os.mkfifo(os.path.join(folder, "model.safetensors"))
        with pytest.raises(ModelFormatError, match="not a regular file"):
            open_model(folder)
        with pytest.raises(ModelFormatError, match="not a regular file"):
            SafetensorsFile(os.path.join(folder, "model.safetensors"))


def test_listed_weights_links(tmp_path):
    """Without an index: a link to a file inside the folder is read, one out of it is refused (the same
    rule as the index's names), and so is a folder named *.safetensors."""
    folder = write_synthetic_hf(tmp_path / "m", arch="qwen2", preset="tiny", dtype="F16")
    st = os.path.join(folder, "model.safetensors")
    os.rename(st, os.path.join(folder, "weights.bin"))
    os.symlink("weights.bin", st)
    assert open_model(folder).source.tensors
    os.remove(st)
    (tmp_path / "secret").write_text(SECRET)
    os.symlink(tmp_path / "secret", st)
    with pytest.raises(ModelFormatError, match="links outside the folder") as e:
        open_model(folder)
    assert SECRET not in str(e.value)
    os.remove(st)
    os.symlink(os.path.join(folder, "weights.bin"), st)
    os.mkdir(os.path.join(folder, "extra.safetensors"))
    with pytest.raises(ModelFormatError, match="'extra.safetensors' .*not a regular file"):
        open_model(folder)


def test_hub_cache_snapshot_links_to_blobs(tmp_path):
    """The Hugging Face hub cache keeps files in models--x/blobs and links models--x/snapshots/<rev>/f to
    them: those links leave the folder but stay in the cached repo, and are read."""
    src = write_synthetic_hf(tmp_path / "src", arch="qwen2", preset="tiny", dtype="F16", shard_bytes=60_000)
    repo = tmp_path / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "0123abc"
    snap.mkdir(parents=True)
    for i, n in enumerate(sorted(os.listdir(src))):
        os.rename(os.path.join(src, n), repo / "blobs" / f"blob{i}")
        os.symlink(f"../../blobs/blob{i}", snap / n)
    open_model(str(snap))
    other = tmp_path / "elsewhere.safetensors"
    other.write_bytes(b"")
    os.remove(snap / "model.safetensors.index.json")
    os.symlink(other, snap / "zz.safetensors")
    with pytest.raises(ModelFormatError, match="'zz.safetensors' .*links outside the folder"):
        open_model(str(snap))
