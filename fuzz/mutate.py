"""Structure-aware mutations: a JSON document with one value changed (config.json, tokenizer files, a
safetensors header), and GGUF metadata values of any type. Byte-level mutation rarely keeps JSON
parseable or a GGUF file consistent, so it mostly tests the first check; these reach the later ones."""
from __future__ import annotations

import json
import math
import random

import numpy as np
from gguf import GGUFValueType as T

INTS = [0, 1, -1, 2, 3, 7, 8, 255, 256, 65535, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53 + 1, 2**63 - 1, 2**63,
        2**64 - 1, -2**31, -2**63, 10**30]
FLOATS = [0.0, -0.0, 0.5, -1.5, 1e-30, 1e-45, 1e30, 1e308, math.nan, math.inf, -math.inf]
STRINGS = ["", " ", "a", "\x00", "\udcff", "é", "<s>", "</s>", "<unk>", "<|im_end|>", "<|endoftext|>", "▁", "a b",
           "x" * 5000, "../../../etc/passwd", "/", "model.safetensors", "missing.safetensors", "tokenizer.json",
           "{{ raise_exception('no') }}", "{% for m in messages %}", "{{ messages[0]['content'] }}",
           "F32", "F16", "BF16", "I64", "U8", "BOOL", "F8_E4M3", "Q4_0", "gpt2", "llama", "qwen2", "qwen3", "gemma3",
           "phi3", "mamba", "LlamaForCausalLM", "Qwen2ForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM",
           "silu", "gelu", "gelu_pytorch_tanh", "relu", "linear", "llama3", "longrope", "su", "yarn", "dynamic",
           "default", "sliding_attention", "full_attention", "ByteLevel", "BPE", "WordPiece", "Unigram", "WordLevel",
           "Metaspace", "Sequence", "Split", "Replace", "Prepend", "TemplateProcessing", "gpt-2", "llama-bpe",
           "qwen2", "smollm", "deepseek-llm", "never", "always", "first"]
# keys the readers look for, added where a document lacks them
JSON_KEYS = ["hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "num_hidden_layers",
             "intermediate_size", "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta",
             "rope_scaling", "rope_parameters", "rope_type", "type", "factor", "low_freq_factor", "high_freq_factor",
             "original_max_position_embeddings", "long_factor", "short_factor", "attention_factor",
             "partial_rotary_factor", "rope_local_base_freq", "hidden_act", "hidden_activation", "mlp_bias",
             "attention_bias", "sliding_window", "use_sliding_window", "layer_types", "sliding_window_pattern",
             "query_pre_attn_scalar", "final_logit_softcapping", "attn_logit_softcapping", "text_config",
             "architectures", "model_type", "_name_or_path", "tie_word_embeddings", "torch_dtype", "bos_token_id",
             "eos_token_id", "pad_token_id", "chat_template", "add_bos_token", "add_eos_token", "bos_token",
             "eos_token", "unk_token", "pad_token", "added_tokens", "normalizer", "pre_tokenizer", "post_processor",
             "decoder", "model", "vocab", "merges", "ignore_merges", "byte_fallback", "prepend_scheme",
             "special", "content", "id", "weight_map", "metadata", "__metadata__", "dtype", "shape", "data_offsets"]


# ---- JSON -----------------------------------------------------------------------------------------

def json_value(rng: random.Random, old=None):
    """A replacement for `old`: a nudge of it (same type), or a value of any JSON type."""
    kind = rng.randrange(8)
    if kind == 0 and isinstance(old, bool):
        return not old
    if kind == 0 and isinstance(old, (int, float)):
        return rng.choice([old + 1, old - 1, old * 2, -old, old // 2 if isinstance(old, int) else old / 3, 0])
    if kind == 0 and isinstance(old, str) and old:
        return rng.choice([old[:-1], old + old[-1], old.upper(), old[::-1]])
    if kind == 0 and isinstance(old, list) and old:
        out = list(old)
        i = rng.randrange(len(out))
        rng.choice([lambda: out.pop(i), lambda: out.insert(i, out[i]), lambda: out.__setitem__(i, json_value(rng)),
                    lambda: out.__delitem__(slice(i, None))])()
        return out
    if kind <= 1:
        return rng.choice(INTS) * rng.choice((1, 1, -1))
    if kind == 2:
        return rng.choice(FLOATS)
    if kind == 3:
        return rng.choice(STRINGS)
    if kind == 4:
        return rng.choice([None, True, False])
    if kind == 5:
        n = rng.choice((0, 1, 2, 5))
        return [json_value(rng) if rng.random() < 0.5 else rng.choice(INTS) for _ in range(n)]
    if kind == 6:
        return {} if rng.random() < 0.3 else {rng.choice(JSON_KEYS): json_value(rng)}
    return rng.choice([str(old), [old], {"content": old, "type": old}])   # the right value, wrongly wrapped


def mutate_json(raw: bytes, rng: random.Random) -> bytes | None:
    """`raw` with one to three values replaced, deleted or added; None when it is not JSON."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    box = [doc]
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        parent, key = box, 0
        node = box[0]
        # walk down a random path (never stopping at the root: replacing the whole document tests little)
        while isinstance(node, (dict, list)) and node and (parent is box or rng.random() < 0.7):
            parent, key = node, (rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node)))
            node = parent[key]
        r = rng.random()
        if r < 0.15 and parent is not box:
            del parent[key]
        elif r < 0.3 and isinstance(node, dict):
            node[rng.choice(JSON_KEYS)] = json_value(rng)
        elif r < 0.35 and isinstance(parent, dict):
            parent[rng.choice(JSON_KEYS)] = parent.pop(key)
        else:
            parent[key] = json_value(rng, node)
    out = json.dumps(box[0], ensure_ascii=rng.random() < 0.5)
    return out.encode("utf-8", "surrogatepass")        # a lone surrogate becomes invalid UTF-8, on purpose


def mutate_safetensors(data: bytes, rng: random.Random) -> bytes | None:
    """A safetensors file with its JSON header mutated (the length prefix usually updated to match)."""
    if len(data) < 8:
        return None
    n = int.from_bytes(data[:8], "little")
    if 8 + n > len(data):
        return None
    head = mutate_json(data[8:8 + n], rng)
    if head is None:
        return None
    size = len(head) if rng.random() < 0.9 else n
    return size.to_bytes(8, "little") + head + data[8 + n:]


# ---- GGUF metadata values -------------------------------------------------------------------------

_INT_TYPES = [T.UINT8, T.INT8, T.UINT16, T.INT16, T.UINT32, T.INT32, T.UINT64, T.INT64]
_RANGE = {t: (np.iinfo(d).min, np.iinfo(d).max) for t, d in
          zip(_INT_TYPES, (np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.uint64, np.int64))}


def _int(fdp, t: T) -> int:
    lo, hi = _RANGE[t]
    v = fdp.PickValueInList(INTS) * (-1 if fdp.ConsumeBool() else 1) if fdp.ConsumeBool() else fdp.ConsumeInt(4)
    return int(min(max(v, lo), hi))


def _float(fdp, t: T) -> float:
    v = fdp.PickValueInList(FLOATS) if fdp.ConsumeBool() else fdp.ConsumeFloat()
    return float(np.float32(v)) if t == T.FLOAT32 else v       # a float32 overflows to inf, as on disk


def _string(fdp) -> bytes:
    s = fdp.PickValueInList(STRINGS) if fdp.ConsumeBool() else fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 16))
    return s.encode("utf-8", "surrogatepass")


def _nudge(fdp, old):
    """`old` (value, type, element type) changed a little, same types."""
    v, t, sub = old
    if t == T.ARRAY:
        out = list(v)
        if out:
            i = fdp.ConsumeIntInRange(0, len(out) - 1)
            op = fdp.ConsumeIntInRange(0, 3)
            if op == 0:
                del out[i:]
            elif op == 1:
                out.pop(i)
            elif op == 2:
                out.insert(i, out[i])
            else:
                out[i] = _string(fdp) if sub == T.STRING else _float(fdp, sub) if sub in (T.FLOAT32, T.FLOAT64) \
                    else fdp.ConsumeBool() if sub == T.BOOL else _int(fdp, sub) if sub in _RANGE else out[i]
        return out, t, sub
    if t == T.STRING:
        return (v[:-1] if fdp.ConsumeBool() else v + _string(fdp)), t, sub
    if t in _RANGE:
        lo, hi = _RANGE[t]
        return int(min(max(v + fdp.PickValueInList([1, -1, v, -v - v]), lo), hi)), t, sub
    if t == T.BOOL:
        return not v, t, sub
    return _float(fdp, t), t, sub


def gguf_value(fdp, old=None) -> tuple:
    """A metadata value and its GGUF types: `old` nudged, or a value of any type (number, NaN, string,
    arrays of each kind, an empty array, an array of arrays)."""
    kind = fdp.ConsumeIntInRange(0, 10)
    if kind == 0 and old is not None:
        return _nudge(fdp, old)
    if kind <= 1:
        t = fdp.PickValueInList(_INT_TYPES)
        return _int(fdp, t), t, None
    if kind == 2:
        t = fdp.PickValueInList([T.FLOAT32, T.FLOAT64])
        return _float(fdp, t), t, None
    if kind == 3:
        return fdp.ConsumeBool(), T.BOOL, None
    if kind == 4:
        return _string(fdp), T.STRING, None
    n = fdp.PickValueInList([1, 2, 3, 8])
    if kind == 5:
        return [_string(fdp) for _ in range(n)], T.ARRAY, T.STRING
    if kind == 6:
        t = fdp.PickValueInList(_INT_TYPES)
        return [_int(fdp, t) for _ in range(n)], T.ARRAY, t
    if kind == 7:
        t = fdp.PickValueInList([T.FLOAT32, T.FLOAT64])
        return [_float(fdp, t) for _ in range(n)], T.ARRAY, t
    if kind == 8:
        return [], T.ARRAY, fdp.PickValueInList(_INT_TYPES + [T.FLOAT32, T.STRING, T.BOOL, T.ARRAY])
    if kind == 9:
        return [fdp.ConsumeBool() for _ in range(n)], T.ARRAY, T.BOOL
    return [[_int(fdp, T.INT32)] for _ in range(n)], T.ARRAY, T.ARRAY


def gguf_keys(arch: str) -> list[str]:
    """Keys the readers look for, which a file may lack."""
    a = arch
    return [f"{a}.attention.sliding_window", f"{a}.attention.sliding_window_pattern", f"{a}.rope.scaling.type",
            f"{a}.rope.scaling.factor", f"{a}.rope.scale_linear", f"{a}.final_logit_softcapping",
            f"{a}.attn_logit_softcapping", f"{a}.rope.scaling.attn_factor",
            f"{a}.rope.scaling.original_context_length", f"{a}.attention.key_length", f"{a}.feed_forward_length",
            f"{a}.vocab_size", f"{a}.rope.dimension_count", f"{a}.rope.freq_base", f"{a}.attention.head_count_kv",
            "general.alignment", "general.basename", "general.name", "tokenizer.ggml.scores",
            "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.pre",
            "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_space_prefix",
            "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id", "tokenizer.ggml.padding_token_id",
            "tokenizer.ggml.unknown_token_id", "tokenizer.chat_template"]
