"""Many sequences on one model: a paged KV cache and batched decode steps (what engine/scheduler.py
drives).

Every layer's K and V live in one pool of pages of `page` positions; each sequence slot has a table
of its pages, so short and long sequences share the memory, and sequences with a common prefix can
share its pages. A decode step advances every row of a batch, each row a token of its own sequence at
its own position: the GEMVs read each weight once for the batch (kernels/gemv.py; their shapes tuned
for batches by `tune`), attention reads each row's own pages, and the sampler draws each row's token
with its sequence's own settings and seed, writing it where that sequence's next step reads it. Below
`gemm_rows` rows every token's arithmetic is the same as when its sequence runs alone, so greedy tokens
do not depend on the batch. From `gemm_rows` rows on, the matmuls take int8 x over the batch's rows
(kernels/gemm.py): matmul_few up to FEW_TOKENS rows (each weight run decoded once for every 8 rows; only
where every matrix is quantized, else such steps keep the GEMVs), the prompt GEMM beyond (K split in
slices fixed by the matrix), and on a device with int8 subgroup matrices the tensor-core GEMM from
gemm.TC_BATCH_ROWS rows (x and W on 16-bit grids). Within each of these a token's arithmetic is the
same in every batch, but not the decode GEMVs' nor the others' (other rounding of x, other order of
sums), so a near-tie may flip when a sequence's batch crosses one of those sizes.

Prompts go through prompt passes: one pass takes stretches of several sequences' prompts (up to the
model's prefill batch of tokens in all), each token at its own slot and position, and samples the token
after each stretch that ends a prompt. A token's arithmetic in a pass does not depend on the other
tokens in it, so a prompt gives the same K/V and first token alone or beside others, in one pass or
several (after a cached prefix, say).

Positions a slot may hold are `seq_ctx`; the host (the scheduler) allocates pages and writes the
tables, and keeps each slot's position: a slot's position on the GPU moves one token a step.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from ..errors import ShaderLMError
from ..gpu.device import READBACK, STORAGE, pack_params
from ..gpu.plan import Plan
from ..gpu.tuner import tune_plan
from ..kernels import gemm, ops
from ..kernels.gemv import batch_key
from ..kernels.grid import cdiv
from ..kernels.tuning import open_cache
from .transformer import PREFILL_TT, Build, Transformer

NONE = 0xFFFFFFFF                # a padding row of a batch
BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
# batches of this many rows or more take the int8 batch matmuls (each weight read and decoded once for all
# rows) instead of the decode GEMVs (each row's own int8 conversion and dots, weights re-read through L2)
GEMM_ROWS = 8


def parse_logprobs(rows: np.ndarray, top: int) -> list[tuple[float, list]]:
    """The logprobs sampler's rows (kernels/sample.wgsl: the token drawn's value, then TOPN (id bits,
    value) pairs) as (log-probability, [(token, log-probability)] of the `top` most likely) a row."""
    return [(float(r[0]), [(int(i), float(v)) for i, v in zip(r[1::2].view(np.uint32)[:top], r[2::2][:top])])
            for r in rows]


@dataclass
class PromptPart:
    """A stretch of one sequence's prompt in a prompt pass: `ids` at positions pos0.. of slot `slot`;
    with `sample`, the token after them is sampled (with `logprobs`, its logprobs row too)."""
    slot: int
    ids: list
    pos0: int
    sample: bool = False
    logprobs: bool = False


def bucket(n: int) -> int:
    """The batch size a step of n rows runs at (plans exist for these sizes; the rest is padding)."""
    for b in BUCKETS:
        if b >= n:
            return b
    raise ValueError(f"a batch of {n} rows is over {BUCKETS[-1]}")


class Serving:
    def __init__(self, net: Transformer, *, slots: int, seq_ctx: int, pages: int | None = None, page: int = 16,
                 steps_ahead: int = 16, tokens_per_submit: int = 8, in_flight: int = 2, gemm_rows: int | None = None):
        """`slots` sequences at once, each up to `seq_ctx` positions; `pages` in the pool (default:
        room for every slot to be full). `steps_ahead`: decode steps a slot may run past its last
        wanted token (queued batches after a stop), whose positions need pages too. `gemm_rows`: steps
        of this many rows or more take the int8 batch matmuls (default the model's option, else GEMM_ROWS
        where prompts take the int8 GEMM; 0: never, nor with experts: their batches keep the GEMVs)."""
        a, dev = net.args, net.dev
        for rows in (gemm_rows, net.gemm_rows, GEMM_ROWS if net.int8_prefill else 0):
            if rows is not None:
                break
        self.gemm_rows = 0 if a.n_experts else rows
        # steps of up to FEW_TOKENS rows have an int8 GEMM (matmul_few) only for quantized weights
        self.few_gemms = net.quantized_matmuls()
        if slots > BUCKETS[-1]:
            raise ShaderLMError(f"--parallel {slots} is over the largest batch, {BUCKETS[-1]}")
        if bucket(slots) > net.batch:
            raise ShaderLMError(f"--parallel {slots}: the model's activation buffers hold {net.batch} rows")
        self.net, self.dev, self.slots, self.page = net, dev, slots, page
        self.seq_ctx = min(seq_ctx, a.context_length)
        self.hist = self.seq_ctx + steps_ahead + 1             # tokens a slot's stretch of the token buffer holds
        self.max_pages = cdiv(self.hist, page)
        self.n_pages = pages or slots * self.max_pages
        self.k_max = tokens_per_submit
        row_bytes = page * a.kv_dim * 2                        # f16 K (or V) of one page, one layer
        if self.n_pages * row_bytes > dev.max_binding:
            raise ShaderLMError(f"a KV pool of {self.n_pages} pages of {page} positions needs "
                                f"{self.n_pages * row_bytes:,} bytes a layer, over this adapter's binding limit "
                                f"of {dev.max_binding:,}: lower --parallel or --ctx")
        self.kv_bytes = 2 * a.n_layers * self.n_pages * row_bytes
        self.k = [dev.buffer(self.n_pages * row_bytes, label=f"k pool {i}") for i in range(a.n_layers)]
        self.v = [dev.buffer(self.n_pages * row_bytes, label=f"v pool {i}") for i in range(a.n_layers)]
        self.pages = dev.buffer(4 * slots * self.max_pages, label="page tables")
        self.seq_pos = dev.buffer(4 * slots, label="slot positions")
        self.tokens = dev.buffer(4 * slots * self.hist, label="slot tokens")
        self.params = dev.buffer(32 * slots, label="slot sampling")
        self.rows = dev.buffer(4 * BUCKETS[-1], label="batch rows")
        self.v4 = cdiv(a.vocab_size, 4) * 4                   # logit row stride: whole vec4s for the sampler
        self.max_rows = bucket(slots)
        # a prompt pass's sequences (first row, rows, slot, first position) and its rows' (slot, position)
        self.prompt_rows = dev.buffer(4 * (4 * slots + 2 * net.batch), label="prompt pass rows")
        # the pass's sampled sequences: the rows of their last tokens, and their slots (the sampler's rows)
        self.head_rows = dev.buffer(4 * self.max_rows, label="prompt head rows")
        self.head_slots = dev.buffer(4 * self.max_rows, label="prompt head slots")
        self.logits = dev.buffer(4 * self.v4 * self.max_rows, label="batch logits")
        self.prefill_state = dev.buffer(32, STORAGE, "prefill state")
        self.max_top_logprobs = ops.TOPN                       # most likely tokens a logprobs row holds
        self.lp_width = 1 + 2 * ops.TOPN                       # floats of logprobs a token
        self.lp = None                                         # made when a request first asks for logprobs
        self._states: dict = {}
        self._decode: dict = {}
        # a batch's tokens, then (where it computes them) their logprobs rows
        self._staging = [dev.buffer(4 * self.max_rows * self.k_max * (1 + self.lp_width), READBACK, "batch readback")
                         for _ in range(in_flight + 1)]
        # a slot's readback of the token its prompt sampled (and its logprobs row), and the submission
        # that wrote it with whether the row is there (first_token)
        self._first = [dev.buffer(4 * (1 + self.lp_width), READBACK, f"first token {s}") for s in range(slots)]
        self._first_at: dict = {}
        self._slot = 0
        for s in range(slots):
            self.set_sampling(s)
        self._build_prefill()
        # every batch size's step now: built on first use, a plan's pipelines compiled mid-serving
        # stalled every running stream (the logprobs pass after it stays lazy: one pipeline)
        self._build_decode()
        if net.tuning is not None:
            self.tune(**net.tuning)

    def _build_decode(self):
        self._decode.clear()
        for rows in BUCKETS[:BUCKETS.index(self.max_rows) + 1]:
            self.decode_plan(rows)

    def tune(self, cache_dir=None, force=False, reps=5, log=None, rows: int = 4) -> list:
        """Tune the shapes of the batched decode GEMVs (those taking several tokens a workgroup:
        kernels/gemv.batch_candidates) on a step of `rows` rows, or of the most rows below that the
        GEMVs run, with pages of their own; and each matrix's GEMM tile or shape for a decode batch
        (gemm.batch_tile_key) on the step of the most rows up to its key's gemm.batch_tuning_rows, every
        slot reading the same pages (only the time counts). Timed from position 64 (or mid-context) of slots
        0..: at start, before any sequence holds pages. Every plan is rebuilt if a shape was tuned (the prompt
        passes' LM head is a batch GEMV too)."""
        on_gemvs = [r for r in BUCKETS[1:] if r <= min(rows, self.max_rows) and not self.on_gemms(r)]
        on_gemms = [r for r in BUCKETS if r <= self.max_rows and self.on_gemms(r)]
        report = []
        if on_gemvs and on_gemvs[-1] * self.max_pages <= self.n_pages:
            for s in range(on_gemvs[-1]):
                self.set_own_pages(s)
            report += self._tune_step(on_gemvs[-1], batch_key, cache_dir, force, reps, log)

        def step_of(key) -> int:        # each key on its own step only, though a larger one may run it too
            return max((r for r in on_gemms if r <= gemm.batch_tuning_rows(key)), default=0)
        for n in on_gemms:
            def only(key, n=n) -> bool:
                return gemm.batch_tile_key(key) and step_of(key) == n
            if any(d.tune and only(d.tune.key) for d in self.decode_plan(n).dispatches):
                for s in range(n):              # (a table's entries past a small pool's pages stay 0: valid)
                    self.set_pages(s, list(range(min(self.max_pages, self.n_pages))))
                report += self._tune_step(n, only, cache_dir, force, reps, log)
        if report:
            self._build_prefill()
            self._build_decode()
        return report

    def _tune_step(self, rows: int, only, cache_dir, force, reps, log) -> list:
        """tune_plan over the decode step of `rows` rows (slots 0..), for the keys `only` accepts."""
        pos0 = min(self.seq_ctx // 2, 64)

        def reset():
            self.dev.write(self.rows, np.arange(rows, dtype=np.uint32))
            self.dev.write(self.seq_pos, np.full(rows, pos0, np.uint32))
        return tune_plan(self.dev, self.decode_plan(rows), open_cache(self.dev, cache_dir), force=force, reps=reps,
                         log=log, reset=reset, max_repeat=max(1, min(64, self.seq_ctx - 1 - pos0)), n=rows, only=only)

    # ---- plans -------------------------------------------------------------------------------
    def _paging(self, rows, ragged: int = 0) -> ops.Paging:
        """The paged cache with `rows` (a buffer of batch rows' slots, or a prompt pass's rows with
        `ragged`, which read no slot positions)."""
        return ops.Paging(self.pages, self.page, self.max_pages, rows=rows, seq_pos=None if ragged else self.seq_pos,
                          hist=self.hist, ragged=ragged)

    def on_gemms(self, n: int) -> bool:
        """Whether a decode step of n sequences (run at bucket(n) rows) runs the int8 batch matmuls."""
        rows = bucket(n) if n > 0 else 0
        return 0 < self.gemm_rows <= rows and (rows > gemm.FEW_TOKENS or self.few_gemms)

    def _build(self, tt: int, state, tiled=True, batch=0, paging=None) -> Build:
        return Build(tt, state=state, tokens=self.tokens, k=self.k, v=self.v, logits=self.logits,
                     logit_stride=self.v4, tiled=tiled, batch=batch, paging=paging or self._paging(self.rows),
                     gemm=self.on_gemms(batch))

    def _build_prefill(self):
        """The prompt pass's plans, one for each count of sampled sequences (a bucket; 0: the layers
        only). A pass always takes the tiled GEMM, whose result for a token does not depend on the other
        tokens of its pass, and tiles each sequence's queries in attention from its first row, as a
        pass of it alone would: a prompt's K/V are the same however it is split or joined, so a
        sequence's tokens do not depend on what ran before it or beside it."""
        net, dev = self.net, self.dev
        body = net.body(self._build(PREFILL_TT, self.prefill_state, paging=self._paging(self.prompt_rows, self.slots)))
        self._head_paging = self._paging(self.head_slots)
        self._passes = {(0, False): Plan(dev, body, "prompt pass")}
        for rows in BUCKETS[:BUCKETS.index(self.max_rows) + 1]:
            head = net.head_ops(1, gather=(self.head_rows, rows))
            self._passes[rows, False] = Plan(dev, body + head + self._sampler(self._head_paging, rows, False),
                                             f"prompt pass, {rows} sampled")

    def prompt_plan(self, rows: int, logprobs: bool = False) -> Plan:
        """The prompt pass sampling `rows` sequences (a bucket size, or 0), its sampler writing
        log-probabilities or not (that one made on first use)."""
        plan = self._passes.get((rows, logprobs))
        if plan is None:
            plan = self._passes[rows, logprobs] = Plan(
                self.dev, self._with_logprobs(self._passes[rows, False], self._head_paging, rows),
                f"prompt pass, {rows} sampled +logprobs")
        return plan

    def _sampler(self, paging, rows: int, logprobs: bool) -> list:
        """The sampler of `rows` rows (one dispatch); with `logprobs`, also writing each row's
        log-probabilities (their buffer made on first use), after a dispatch of the rows' log-sum-exp
        partials."""
        if logprobs and self.lp is None:
            self.lp = self.dev.buffer(4 * self.slots * self.hist * self.lp_width, label="slot logprobs")
        return ops.sample(self.dev, self.logits, self.tokens, None, self.params, paging=paging, batch=rows,
                          logprobs=self.lp if logprobs else None, vocab=self.net.args.vocab_size)

    def _with_logprobs(self, plan: Plan, paging, rows: int) -> list:
        """`plan`'s dispatches with its sampler (the last, one dispatch) also writing log-probabilities."""
        return plan.dispatches[:-1] + self._sampler(paging, rows, True)

    def decode_plan(self, rows: int, logprobs: bool = False) -> Plan:
        """The decode step of `rows` rows (a bucket size), its sampler writing log-probabilities or not
        (built at start, the logprobs sampler on first use)."""
        plan = self._decode.get((rows, logprobs))
        if plan is None:
            if logprobs:                                         # the plain step with the logprobs sampler
                dispatches = self._with_logprobs(self.decode_plan(rows), self._paging(self.rows), rows)
            else:
                net, dev = self.net, self.dev
                state = self._states[rows] = dev.upload(np.array([0, rows, 0, 0, 0, 0, 0, 0], np.uint32), STORAGE,
                                                        f"batch state {rows}")
                sampler = self._sampler(self._paging(self.rows), rows, False)
                build = self._build(1, state, batch=rows)
                body = net.body(build)
                head = net.head_ops(rows) if build.gemm else net.head_ops(1, decode=net.fuse)
                dispatches = body + head + sampler
            plan = self._decode[rows, logprobs] = Plan(self.dev, dispatches, f"serving decode x{rows}"
                                                       + " +logprobs" * logprobs)
        return plan

    # ---- per-slot state ------------------------------------------------------------------------
    def set_pages(self, slot: int, pages: list[int]):
        """Slot `slot`'s page table (its first len(pages) entries)."""
        if len(pages) > self.max_pages:
            raise ValueError(f"{len(pages)} pages for a slot of {self.max_pages}")
        self.dev.write(self.pages, np.asarray(pages, np.uint32), offset=4 * slot * self.max_pages)

    def set_own_pages(self, slot: int):
        """Slot `slot`'s table: pages slot * max_pages onwards, a stretch of its own in a pool of the
        default size (for callers without a page pool: benchmarks, profiles, tests)."""
        if (slot + 1) * self.max_pages > self.n_pages:
            raise ValueError(f"slot {slot}'s own pages end past the pool's {self.n_pages}")
        self.set_pages(slot, list(range(slot * self.max_pages, (slot + 1) * self.max_pages)))

    def set_sampling(self, slot: int, temperature=0.0, top_k=0, top_p=1.0, seed=0, top_logprobs=0):
        """Slot `slot`'s sampler settings, and how many of the most likely tokens its logprobs rows give."""
        vals = ops.sample_params(self.net.args.vocab_size, temperature, top_k, top_p, seed, top_logprobs)
        self.dev.write(self.params, pack_params(*vals), offset=32 * slot)

    def prefill(self, slot: int, ids: list[int], pos0: int, sample: bool, logprobs: bool = False):
        """Feed `ids` at positions pos0.. of slot `slot`, a pass of the model's prefill batch at a time,
        the last sampling the token at pos0 + len(ids) where `sample` (and its logprobs, where asked)."""
        step = self.net.batch
        for at in range(0, len(ids), step):
            self.prefill_pass([PromptPart(slot, ids[at:at + step], pos0 + at, sample and at + step >= len(ids),
                                          logprobs)])

    def prefill_pass(self, parts: list[PromptPart]):
        """One prompt pass over `parts` (distinct slots; up to the model's prefill batch of tokens in
        all), submitted: the tokens' K/V into their slots' pages, and for each part that samples, the
        token after it (first_token reads it)."""
        dev, n = self.dev, sum(len(p.ids) for p in parts)
        if not parts or any(not p.ids for p in parts) or n > self.net.batch:
            raise ValueError(f"a prompt pass of {len(parts)} stretches, {n} tokens: one or more non-empty stretches "
                             f"and at most {self.net.batch} tokens")
        # distinct slots, each below self.slots (next), so no more stretches than the table's slots
        if len({p.slot for p in parts}) != len(parts):
            raise ValueError(f"a prompt pass takes a slot once, not slots {[p.slot for p in parts]}")
        for p in parts:
            if not 0 <= p.slot < self.slots or p.pos0 < 0 or p.pos0 + len(p.ids) > self.seq_ctx:
                raise ValueError(f"a prompt pass's stretch at positions {p.pos0}..{p.pos0 + len(p.ids) - 1} of slot "
                                 f"{p.slot}: slots hold positions 0..{self.seq_ctx - 1}, slots are 0..{self.slots - 1}")
        table = np.zeros((self.slots, 4), np.uint32)           # unused entries: no rows
        rows = np.empty((n, 2), np.uint32)
        heads, t = [], 0
        for j, p in enumerate(parts):
            m, end = len(p.ids), p.pos0 + len(p.ids)
            table[j] = (t, m, p.slot, p.pos0)
            rows[t:t + m, 0], rows[t:t + m, 1] = p.slot, np.arange(p.pos0, end)
            dev.write(self.tokens, np.asarray(p.ids, np.uint32), offset=4 * (p.slot * self.hist + p.pos0))
            # the sampler writes the token after seq_pos and moves it there
            dev.write(self.seq_pos, np.array([end - 1 if p.sample else end], np.uint32), offset=4 * p.slot)
            if p.sample:
                heads.append((t + m - 1, p))
            t += m
        dev.write(self.prompt_rows, np.concatenate([table.ravel(), rows.ravel()]))
        dev.write(self.prefill_state, np.array([0, n, 0, 0, 0, 0, 0, 0], np.uint32))
        sampled = bucket(len(heads)) if heads else 0
        logprobs = any(p.logprobs for _, p in heads)
        if heads:
            pad = sampled - len(heads)
            dev.write(self.head_rows, np.array([r for r, _ in heads] + [0] * pad, np.uint32))
            dev.write(self.head_slots, np.array([p.slot for _, p in heads] + [NONE] * pad, np.uint32))
        index = self.prompt_plan(sampled, logprobs).run(n, then=self._first_copies([p for _, p in heads], logprobs))
        for _, p in heads:
            self._first_at[p.slot] = (index, logprobs)

    def _first_copies(self, parts: list[PromptPart], logprobs: bool):
        """The copies, each into its slot's own readback buffer, of the tokens a prompt pass samples after
        `parts` (and their logprobs rows): first_token reads them without waiting for the decode batches
        queued after."""
        w = self.lp_width

        def copy(enc):
            for p in parts:
                buf, at = self._first[p.slot], p.slot * self.hist + p.pos0 + len(p.ids)
                enc.copy_buffer_to_buffer(self.tokens, 4 * at, buf, 0, 4)
                if logprobs:
                    enc.copy_buffer_to_buffer(self.lp, 4 * at * w, buf, 4, 4 * w)
        return copy if parts else None

    @property
    def reads_by_submission(self) -> bool:
        """Whether first_token and tokens_of wait only for the submission that wrote what they read, not
        for the batches submitted after it too (Device.read_after)."""
        return self.dev.reads_by_submission

    def first_token(self, slot: int, top: int | None = None) -> tuple[int, tuple | None]:
        """The token slot's last prefill sampled, and with `top` its logprobs (read_logprobs' row, the
        prefill having asked for them), once that prefill is done: decode batches submitted after it
        may still run."""
        index, logprobs = self._first_at[slot]
        if top is not None and not logprobs:
            raise ValueError(f"slot {slot}'s prefill did not write logprobs")
        raw = self.dev.read_after(self._first[slot], index, 4 * (1 + self.lp_width * (top is not None)))
        row = None if top is None else parse_logprobs(np.frombuffer(raw, np.float32, offset=4)[None], top)[0]
        return int(np.frombuffer(raw, np.uint32, count=1)[0]), row

    def read_tokens(self, slot: int, pos: int, n: int) -> list[int]:
        return self.dev.read(self.tokens, np.uint32, offset=4 * (slot * self.hist + pos), size=4 * n).tolist()

    def read_logprobs(self, slot: int, pos: int, n: int, top: int) -> list[tuple[float, list]]:
        """For the tokens at positions pos.. of slot `slot`: (the sampled token's log-probability,
        [(token, log-probability)] of the `top` most likely), from the logprobs sampler's rows."""
        w = self.lp_width
        return parse_logprobs(self.dev.read(self.lp, np.float32, offset=4 * (slot * self.hist + pos) * w,
                                            size=4 * n * w).reshape(n, w), top)

    # ---- decode batches -------------------------------------------------------------------------
    def record(self, slots: list[int], positions: list[int], k: int, logprobs: bool = False):
        """A recorded batch of k decode steps for the sequences in `slots` (at `positions`: the token
        each feeds next), their new tokens copied to the next readback buffer (with `logprobs`, their
        logprobs rows too, as many likely tokens as each slot's settings say: batch_logprobs reads them)."""
        if not 0 < k <= self.k_max:
            raise ValueError(f"{k} steps a batch, outside 1..{self.k_max}")
        rows = bucket(len(slots))
        plan = self.decode_plan(rows, logprobs)
        self._slot = (self._slot + 1) % len(self._staging)
        staging = self._staging[self._slot]
        self.dev.write(self.rows, np.array(list(slots) + [NONE] * (rows - len(slots)), np.uint32))

        w, lp0 = self.lp_width, 4 * len(slots) * k        # logprobs rows after the tokens

        def copies(enc):
            for i, (s, p) in enumerate(zip(slots, positions)):
                enc.copy_buffer_to_buffer(self.tokens, 4 * (s * self.hist + p + 1), staging, 4 * i * k, 4 * k)
                if logprobs:
                    enc.copy_buffer_to_buffer(self.lp, 4 * (s * self.hist + p + 1) * w, staging,
                                              lp0 + 4 * i * k * w, 4 * k * w)
        return SimpleNamespace(cb=plan.record(rows, repeat=k, then=copies), staging=staging, n=len(slots), k=k,
                               logprobs=logprobs, lp_rows=None, index=None)

    def submit(self, batch):
        batch.index = self.dev.submit([batch.cb])

    def tokens_of(self, batch) -> np.ndarray:
        """A submitted batch's new tokens, (rows, k), once the GPU has written them (and its logprobs
        rows, read in the same map: no wait for the batches queued after it)."""
        n = batch.n * batch.k
        raw = self.dev.read_after(batch.staging, batch.index, 4 * n * (1 + self.lp_width * batch.logprobs))
        if batch.logprobs:
            batch.lp_rows = np.frombuffer(raw, np.float32, offset=4 * n).reshape(batch.n, batch.k, self.lp_width)
        return np.frombuffer(raw, np.uint32, count=n).reshape(batch.n, batch.k)

    def batch_logprobs(self, batch, row: int, top: int) -> list[tuple[float, list]]:
        """read_logprobs' answer for the k tokens of a batch's row `row` (after tokens_of)."""
        return parse_logprobs(batch.lp_rows[row], top)

    def last_logits(self, rows: int) -> np.ndarray:
        """The logits of the last step's first `rows` rows (tests)."""
        V = self.net.args.vocab_size
        return self.dev.read(self.logits, np.float32, 0, 4 * self.v4 * rows).reshape(rows, self.v4)[:, :V]
