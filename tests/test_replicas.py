"""`serve --replicas`: two engine replicas of the tiny synthetic model on a local Ray instance, behind one
OpenAI endpoint (server/replicas.py)."""
from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import httpx
import pytest

pytest.importorskip("ray.serve")

PARALLEL = 4
MODEL = "model0.gguf"      # the served name: the file's


def test_router_prefers_the_replica_with_a_clearly_longer_prefix():
    """PrefixAffinityRouter's choice alone (ranks of replicas; Ray's base class then takes the least busy
    of the first rank that has room), with made-up replicas and queue lengths."""
    from types import SimpleNamespace

    from shaderlm.server.replicas import AFFINITY_WAIT_S, BLOCK, PrefixAffinityRouter, Routed, prefixes

    router = object.__new__(PrefixAffinityRouter)     # Ray builds it with a controller; only its policy here
    router.initialize_state(imbalance=2)
    queue = {"a": 0, "b": 0}
    router._replica_queue_len_cache = queue
    a, b = SimpleNamespace(replica_id="a"), SimpleNamespace(replica_id="b")

    def pending(ids):
        return SimpleNamespace(args=[Routed(None, prefixes(ids))], routing_context=SimpleNamespace())

    def choose(p):
        return [[r.replica_id for r in rank] for rank in asyncio.run(router.choose_replicas([a, b], p))]

    turn1 = list(range(100, 132))
    assert sorted(choose(pending(turn1))[0]) == ["a", "b"]          # nothing seen yet: the least busy
    router.on_request_routed(pending(turn1), "a", None)
    turn2 = pending(turn1 + list(range(500, 520)))
    assert choose(turn2) == [["a"]]                                  # the conversation's replica, alone...
    turn2.routing_context.affinity_since -= AFFINITY_WAIT_S
    assert choose(turn2) == [["a"], ["b"]]                           # ...then the others may take it too
    near = turn1[:BLOCK] + list(range(900, 928))                     # one block in common: not worth it
    assert sorted(choose(pending(near))[0]) == ["a", "b"]
    queue["a"] = 3                                                   # over the imbalance bound
    assert sorted(choose(pending(turn1 + [7] * 8))[0]) == ["a", "b"]
    queue["a"] = 0
    router.on_request_routed(pending(turn1), "b", None)             # both hold it: a tie
    assert sorted(choose(pending(turn1 + [7] * 8))[0]) == ["a", "b"]


def _descendants(pid: int) -> set[int]:
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p and c not in out]
        out.update(kids)
        todo += kids
    return out


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc for the processes Ray started")
def test_sigterm_takes_the_application_and_ray_down(tiny_gguf):
    """`serve --replicas` stopped as a service manager stops it: a clean exit, and the local Ray it started
    (and so every replica) gone with it. (Before runs the fixture below: no Ray in this process yet.)"""
    import subprocess
    import sys
    port = 8733
    proc = subprocess.Popen([sys.executable, "-m", "shaderlm", "serve", "-m", tiny_gguf, "--replicas", "1",
                             "--parallel", "2", "-c", "128", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while not any("serving on" in line for line in lines):       # printed once it handles SIGTERM
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
            time.sleep(0.2)
        _wait_for(f"http://127.0.0.1:{port}", lambda h: h["replicas_ready"] == 1)
        started = _descendants(proc.pid)
        assert started, "Ray started no processes?"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        reader.join(timeout=10)
    finally:
        proc.kill()
    out = "".join(lines)
    assert proc.returncode == 0, out[-3000:]
    assert "SIGTERM received" not in out        # Ray's handler's crash report
    deadline = time.monotonic() + 20
    while (left := {p for p in started if os.path.exists(f"/proc/{p}")}) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, [open(f"/proc/{p}/cmdline").read().replace("\0", " ")[:100] for p in left]


@pytest.fixture(scope="module")
def replicas(synth_gguf):
    from shaderlm.server import replicas
    global MODEL
    path = synth_gguf(seed=3, preset="tiny", arch="llama", quant="Q8_0")
    MODEL = os.path.basename(path)
    app = replicas.start(path, port=8731, replicas=2, parallel=PARALLEL, queue_size=8, ctx=256)
    try:
        _wait_for(app.url, lambda h: h["replicas_ready"] == 2)
        yield app, path
    finally:
        app.close()


def _wait_for(url, ok, timeout=90.0) -> dict:
    """/health's answer (200 or 503) once ok(answer); a server not listening yet is waited for."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            health = httpx.get(url + "/health", timeout=10).json()
        except (httpx.TransportError, ValueError):      # not listening, or Ray's proxy before the app is up
            health = None
        if health is not None and ok(health):
            return health
        assert time.monotonic() < deadline, health
        time.sleep(0.5)


def _served(url) -> dict:
    return {r["replica"]: r["requests_total"] for r in httpx.get(url + "/health").json()["replicas"]}


def test_concurrent_clients_are_spread_and_answered(replicas, capsys):
    """The official client, 10 requests at once: every one answered, both replicas take some, and a greedy
    reply is `shaderlm run --temp 0`'s."""
    from openai import AsyncOpenAI

    from shaderlm.cli import main
    app, path = replicas
    prompt = "the quick brown fox"
    assert main(["run", "-m", path, "--raw", "--temp", "0", "-n", "12", "-c", "160", prompt]) == 0
    want = capsys.readouterr().out[:-1]
    before = _served(app.url)

    async def chat(client, i):
        stream = await client.chat.completions.create(
            model=MODEL, max_tokens=24, seed=i, temperature=0.8, stream=True,
            messages=[{"role": "user", "content": f"story number {i}: " + "once upon a time " * (i % 4 + 1)}])
        finish = [c.choices[0].finish_reason async for c in stream if c.choices]
        return finish[-1]

    async def run():
        async with AsyncOpenAI(base_url=f"{app.url}/v1", api_key="none", max_retries=0) as client:
            greedy = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
            return await asyncio.gather(greedy, *(chat(client, i) for i in range(9)))

    greedy, *finishes = asyncio.run(run())
    assert greedy.choices[0].text == want
    assert all(f in ("stop", "length") for f in finishes), finishes
    after = _wait_for(app.url, lambda h: sum(r["requests_total"] for r in h["replicas"]) >= sum(before.values()) + 10)
    served = {r["replica"]: r["requests_total"] - before.get(r["replica"], 0) for r in after["replicas"]}
    assert len(served) == 2 and all(n > 0 for n in served.values()), served
    metrics = dict(line.rsplit(" ", 1) for line in httpx.get(app.url + "/metrics").text.splitlines()
                   if line.startswith("shaderlm_"))
    assert float(metrics["shaderlm_replicas_ready"]) == 2
    assert float(metrics["shaderlm_requests_total"]) == sum(r["requests_total"] for r in after["replicas"])


def test_a_conversation_stays_on_its_replica(replicas):
    """Each turn's prompt starts with the last turn's prompt and reply: the router sends it where those KV
    pages are. Two conversations at once, three turns each (more could put more in flight on one replica
    than the router's imbalance bound, --parallel/4 or 2, lets it keep)."""
    from openai import AsyncOpenAI
    app, _ = replicas

    async def conversation(client, i):
        messages, where = [], []
        for turn in range(3):
            messages.append({"role": "user", "content": f"conversation {i}, turn {turn}"})
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=messages, max_tokens=16, temperature=0)
            where.append(raw.headers["x-shaderlm-replica"])
            messages.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
        return where

    async def run():
        async with AsyncOpenAI(base_url=f"{app.url}/v1", api_key="none", max_retries=0) as client:
            return await asyncio.gather(*(conversation(client, i) for i in range(2)))

    for where in asyncio.run(run()):
        assert len(set(where)) == 1, where


def test_a_replica_killed_mid_stream(replicas):
    """SIGKILL the replica a stream is on: that client gets an error in its stream (no hang), new requests
    are answered meanwhile, and Ray starts a replacement."""
    app, _ = replicas
    pids = {r["replica"]: r["pid"] for r in httpx.get(app.url + "/health").json()["replicas"]}
    body = dict(messages=[{"role": "user", "content": "a long answer please"}], max_tokens=220, stream=True,
                temperature=0.8, seed=1)
    with httpx.stream("POST", app.url + "/v1/chat/completions", json=body, timeout=30) as r:
        victim = r.headers["x-shaderlm-replica"]
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        os.kill(pids[victim], signal.SIGKILL)
        rest = list(lines)             # ends (within httpx's 30 s read timeout) rather than hanging
    assert any('"error"' in line for line in rest), rest[-3:]
    assert rest[-2:] == ["data: [DONE]", ""] or rest[-1] == "data: [DONE]"

    for i in range(3):                  # answered while the replacement starts
        r = httpx.post(app.url + "/v1/completions", json=dict(prompt=f"still there {i}?", max_tokens=4), timeout=60)
        assert r.status_code == 200, r.text
        assert r.headers["x-shaderlm-replica"] != victim

    health = _wait_for(app.url, lambda h: h["replicas_ready"] == 2 and victim not in
                       {r["replica"] for r in h["replicas"] if r["state"] == "ready"})
    assert pids[victim] not in {r["pid"] for r in health["replicas"] if r["state"] == "ready"}
    assert health["status"] == "ok"
