"""Drive an OpenAI-compatible server with N concurrent streamed chat completions (the official
`openai` async client) and report time to first token and inter-token latency percentiles, aggregate
tokens/s, and every completion checked (no error, a finish reason, usage counts; with --logprobs as many
tokens streamed as usage says).

    python bench/load.py --url http://127.0.0.1:8080 -c 64 -n 128 --requests 128 --procs 4

One Python process parses a few thousand chunks a second through the client: past that, `--procs`
shares the streams between client processes, so that the client does not set the pace.
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import queue
import statistics
import sys
import time


def pct(values, q):
    s = sorted(v for v in values if v == v)      # NaN (no token streamed) left out
    if not s:
        return float("nan")
    return s[min(len(s) - 1, int(q / 100 * len(s)))]


async def one(client, model, i, n, temperature, logprobs):
    """One streamed request. Tokens are timed as their chunks arrive: chunks with text, or with
    `logprobs` every token's chunk (a token that decodes to no text, as a control token or a synthetic
    file's padding from before shaderlm gave it text, streams no chunk of its own otherwise)."""
    t0 = time.perf_counter()
    stamps, text, finish, usage = [], [], None, None
    extra = dict(logprobs=True, top_logprobs=0) if logprobs else {}
    stream = await client.chat.completions.create(
        model=model, max_tokens=n, temperature=temperature, seed=i, stream=True,
        stream_options={"include_usage": True}, **extra,
        messages=[{"role": "user", "content": f"Request {i}: write a long story about the number {i}."}])
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            tokens = len(c.logprobs.content or []) if c.logprobs else 0
            if c.delta.content or tokens:       # (text held back until the end comes without logprobs)
                stamps += [time.perf_counter()] * (tokens if logprobs else 1)
                text.append(c.delta.content or "")
            if c.finish_reason:
                finish = c.finish_reason
    ok = finish in ("stop", "length") and usage is not None and usage.completion_tokens > 0 \
        and (not logprobs or len(stamps) == usage.completion_tokens)
    return dict(ok=ok, ttft=(stamps[0] - t0) if stamps else float("nan"),
                decode_tps=(len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 and stamps[-1] > stamps[0]
                else float("nan"),
                itl=[b - a for a, b in zip(stamps, stamps[1:])], tokens=usage.completion_tokens if usage else 0,
                prompt_tokens=usage.prompt_tokens if usage else 0,
                finish=f"{finish}, {len(stamps)} tokens streamed, usage {usage.completion_tokens if usage else None}")


async def drive(args, ids, concurrency: int, start=None):
    """Requests `ids`, `concurrency` at a time, from this process: (model, start and end time, results).
    `start`: a barrier the client processes pass together once connected."""
    from openai import AsyncOpenAI
    client = AsyncOpenAI(base_url=f"{args.url}/v1", api_key="none", max_retries=0, timeout=600)
    model = (await client.models.list()).data[0].id
    sem = asyncio.Semaphore(concurrency)

    async def bounded(i):
        async with sem:
            try:
                return await one(client, model, i, args.n, args.temperature, args.logprobs)
            except Exception as e:  # noqa: BLE001 - counted as a failure, reported below
                return dict(ok=False, ttft=float("nan"), decode_tps=float("nan"), itl=[], tokens=0,
                            finish=f"{type(e).__name__}: {e}")

    if start is not None:
        await asyncio.to_thread(start.wait)     # off the event loop: the client's connections stay served
    t0 = time.time()
    results = await asyncio.gather(*[bounded(i) for i in ids])
    return model, t0, time.time(), results


def _drive_share(args, ids, concurrency, start, out):
    out.put(asyncio.run(drive(args, ids, concurrency, start)))


def main(args) -> int:
    if args.procs <= 1:
        model, t0, t1, results = asyncio.run(drive(args, range(args.requests), args.concurrency))
    else:                       # request i to process i % procs, the concurrency shared alike
        ctx = mp.get_context("spawn")
        start, out = ctx.Barrier(args.procs), ctx.Queue()
        procs = [ctx.Process(target=_drive_share, args=(args, range(j, args.requests, args.procs),
                                                       len(range(j, args.concurrency, args.procs)), start, out))
                 for j in range(args.procs)]
        for pr in procs:
            pr.start()
        shares = []
        while len(shares) < len(procs):
            try:
                shares.append(out.get(timeout=1.0))
            except queue.Empty:
                failed = [pr.exitcode for pr in procs if pr.exitcode not in (None, 0)]
                if failed:      # a client process died (its traceback above): the others would wait forever
                    start.abort()
                    for pr in procs:
                        pr.terminate()
                    print(f"a client process exited with code {failed[0]} before reporting", file=sys.stderr)
                    return 2
        for pr in procs:
            pr.join()
        model, t0, t1 = shares[0][0], min(s[1] for s in shares), max(s[2] for s in shares)
        results = [r for s in shares for r in s[3]]
    return report(args, model, results, t1 - t0)


def report(args, model, results, wall) -> int:
    failed = [r for r in results if not r["ok"]]
    ttft = [r["ttft"] for r in results if r["ok"] and r["ttft"] == r["ttft"]]
    itl = [x for r in results if r["ok"] for x in r["itl"]]
    tokens = sum(r["tokens"] for r in results)
    print(f"{model}: {args.requests} requests, {args.concurrency} at once from {args.procs} client process"
          f"{'es' * (args.procs > 1)}, max_tokens {args.n}, {wall:.1f} s")
    print(f"completed {len(results) - len(failed)}, failed {len(failed)}"
          + (f" (first: {failed[0]['finish']})" if failed else ""))
    print(f"tokens {tokens}, aggregate {tokens / wall:.1f} tok/s")
    print(f"TTFT ms ({len(ttft)} requests that streamed a token): p50 {1e3 * pct(ttft, 50):.1f}  "
          f"p99 {1e3 * pct(ttft, 99):.1f}  max {1e3 * max(ttft, default=float('nan')):.1f}")
    print(f"inter-token ms: p50 {1e3 * pct(itl, 50):.2f}  p99 {1e3 * pct(itl, 99):.2f}  "
          f"mean {1e3 * statistics.fmean(itl) if itl else float('nan'):.2f}")
    # a stream's decode speed: its streamed tokens after the first over the time between first and last
    # (after a prompt of this many tokens: compare with `shaderlm bench -d` at that depth too)
    rate = [r["decode_tps"] for r in results if r["ok"]]
    prompts = [r["prompt_tokens"] for r in results if r["ok"]]
    print(f"decode tok/s a stream: p50 {pct(rate, 50):.1f}  min {min(rate, default=float('nan')):.1f}  "
          f"(prompts of {pct(prompts, 50):.0f} tokens, p50)")
    slowest = min((r for r in results if r["ok"] and r["itl"]), key=lambda r: r["decode_tps"], default=None)
    if slowest:         # one long wait, or every token slower?
        gaps = slowest["itl"]
        worst = max(range(len(gaps)), key=gaps.__getitem__)
        print(f"slowest stream: longest wait {1e3 * gaps[worst]:.1f} ms, after its token {worst + 1} of "
              f"{len(gaps) + 1}; its median wait {1e3 * statistics.median(gaps):.2f} ms")
    return 1 if failed else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("-c", "--concurrency", type=int, default=64, help="streams open at once")
    ap.add_argument("--requests", type=int, default=0, help="requests in all (default: the concurrency)")
    ap.add_argument("-n", type=int, default=128, help="max_tokens of each")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--logprobs", action="store_true",
                    help="ask for logprobs, so that every token streams a chunk and is timed (for models "
                         "whose tokens may decode to no text)")
    ap.add_argument("--procs", type=int, default=1, help="client processes sharing the streams")
    a = ap.parse_args()
    a.requests = a.requests or a.concurrency
    a.procs = max(1, min(a.procs, a.concurrency))
    raise SystemExit(main(a))
