"""`shaderlm serve --replicas N`: several engines behind one OpenAI endpoint, on Ray Serve.

WebGPU has no collectives across adapters, so a WGSL engine scales out by replicas. Ray Serve does the
cluster work (it starts the replicas, restarts one that dies, scales their number by queue depth, and
runs the HTTP proxy); this module only says what a replica is and where a request goes:
- EngineReplica: one serving Engine on one adapter (round-robin over a host's adapters). It streams a
  request's events in batches, whatever has arrived, so that a Ray message carries several tokens.
- Frontend, the ingress: server/app.py's app over a RemoteEngine. Requests are checked, templated and
  tokenized here as in the plain server; each choice then goes to a replica through a deployment handle.
- PrefixAffinityRouter, Ray Serve's request-router hook: a request goes to the replica that has seen the
  longest prefix of its prompt (its KV pages may be cached there: a conversation's next turn), unless
  that replica is much busier; otherwise to the least busy. (Ray's own PrefixCacheAffinityRouter imports
  vLLM or SGLang, and matches text where this matches token ids.)
- StatsBoard: a small actor each replica reports its stats to; /health and /metrics read it.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import ray
from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.exceptions import BackPressureError, RequestCancelledError
from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

from ..engine.requests import EngineClosedError, QueueFullError, Request
from ..errors import ShaderLMError
from .app import create_app

APP = "shaderlm"
NAMESPACE = "shaderlm"
BLOCK = 4                  # prompts are matched this many tokens at a time
AFFINITY_WAIT_S = 1.0      # how long a request waits for the replica with its prefix before others may take it
AFFINITY_MIN = 2           # blocks a replica's match must be longer than every other's to be preferred
REPORT_EVERY_S = 0.5       # replica -> board
STALE_S = 5.0              # a replica silent this long is not counted
FORGET_S = 60.0            # nor shown


@dataclass
class Routed:
    """What a replica is called with: the engine request, and its prompt's prefixes for the router."""
    request: Request
    prefixes: list[int]


def prefixes(ids: list[int], block: int = BLOCK) -> list[int]:
    """A hash of each prefix of `ids` that is whole blocks, shortest first (equal prefixes, equal hashes)."""
    out, h = [], 0
    for i in range(0, len(ids) - block + 1, block):
        h = hash((h, *ids[i:i + block]))
        out.append(h)
    return out


# ---- routing ------------------------------------------------------------------------------------------
class PrefixAffinityRouter(FIFOMixin, RequestRouter):
    """Ray Serve request router (runs in each process that holds a handle to the replicas: the frontend)."""

    def initialize_state(self, imbalance: int = 8, max_prefixes: int = 200_000):
        self.imbalance = imbalance              # ongoing requests more than the least busy replica: too busy
        self.max_prefixes = max_prefixes        # more than the replicas' KV caches hold
        self.seen: OrderedDict[int, int] = OrderedDict()   # prefix hash -> bit mask of the replicas that had it
        self.bits: dict = {}                                # replica id -> its bit

    def _get_pending_request_matching_metadata(self, request_metadata=None):
        # the replica chosen for a request goes to that request (FIFOMixin alone gives it to the oldest one
        # waiting); the oldest one takes it only when that request is gone
        return self._get_pending_request_matching_internal_request_id(request_metadata)

    def _bit(self, replica_id) -> int:
        return self.bits.setdefault(replica_id, 1 << len(self.bits))

    def _load(self, replica: RunningReplica) -> int:
        return self.replica_queue_len_cache.get(replica.replica_id) or 0

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        keys = _prefixes_of(pending_request)
        if not keys or len(candidate_replicas) < 2:
            return [candidate_replicas]
        matched = {r.replica_id: 0 for r in candidate_replicas}
        for n, h in enumerate(keys, 1):
            holders = self.seen.get(h, 0)
            hit = [rid for rid in matched if holders & self._bit(rid) and matched[rid] == n - 1]
            if not hit:
                break
            for rid in hit:
                matched[rid] = n
        best = max(matched.values())
        runner_up = max((m for m in matched.values() if m < best), default=0)
        lightest = min(self._load(r) for r in candidate_replicas)
        favoured = [r for r in candidate_replicas
                    if matched[r.replica_id] == best and self._load(r) <= lightest + self.imbalance]
        if best - runner_up < AFFINITY_MIN:
            favoured = []    # a few tokens more in common ("Request 1" and "Request 12") are not worth a queue
        if favoured and len(favoured) < len(candidate_replicas):
            # a busy replica can miss Ray's queue-length probe deadline: try it alone for a while first
            since = pending_request.routing_context.__dict__.setdefault("affinity_since", time.monotonic())
            if time.monotonic() - since < AFFINITY_WAIT_S:
                return [favoured]
            return [favoured, [r for r in candidate_replicas if r not in favoured]]
        return [random.sample(candidate_replicas, len(candidate_replicas))]   # the least busy, ties at random

    def on_request_routed(self, pending_request: PendingRequest, replica_id, result) -> None:
        bit = self._bit(replica_id)
        for h in _prefixes_of(pending_request):
            self.seen[h] = self.seen.get(h, 0) | bit
            self.seen.move_to_end(h)
        while len(self.seen) > self.max_prefixes:
            self.seen.popitem(last=False)


def _prefixes_of(pending_request: PendingRequest | None) -> list[int]:
    # by attribute: this module's classes reach the router's process pickled by value, so isinstance fails
    return getattr(pending_request.args[0], "prefixes", []) if pending_request and pending_request.args else []


# ---- replicas -------------------------------------------------------------------------------------------
@ray.remote(num_cpus=0)
class StatsBoard:
    def __init__(self):
        self.reports: dict[str, tuple[float, dict]] = {}

    def put(self, replica: str, report: tuple[dict, dict]):
        self.reports[replica] = (time.time(), report)

    def get(self) -> dict[str, tuple[float, tuple[dict, dict]]]:
        """replica -> (seconds since its last report, its (facts, engine stats))."""
        now = time.time()
        for name in [n for n, (t, _) in self.reports.items() if now - t > FORGET_S]:
            del self.reports[name]
        return {name: (now - t, report) for name, (t, report) in self.reports.items()}


def _device_for(local_rank: int, devices: list[str] | None) -> str:
    """--device's adapters round-robin, else the host's adapters like its default one."""
    return devices[local_rank % len(devices)] if devices else f"peer:{local_rank}"


class EngineReplica:
    def __init__(self, model: str | None, devices: list[str] | None, engine_kw: dict, board: str):
        import shaderlm
        context = serve.get_replica_context()
        self.name = context.replica_id.unique_id
        self.device = _device_for(context.rank.local_rank, devices)
        self.engine = shaderlm.serve_engine(model, device=self.device, progress=False, **engine_kw,
                                            log=lambda m: print(f"shaderlm replica {self.name}: {m}", flush=True))
        self.board = ray.get_actor(board, namespace=NAMESPACE)
        self.facts = dict(replica=self.name, pid=os.getpid(), host=ray.util.get_node_ip_address(),
                          device=self.engine.model.device.name)
        self._stop = threading.Event()
        threading.Thread(target=self._report, name="shaderlm-report", daemon=True).start()

    def _report(self):
        while True:
            self.board.put.remote(self.name, (self.facts, self.engine.stats()))
            if self._stop.wait(REPORT_EVERY_S):
                return

    def info(self) -> dict:
        return dict(tokenizer=self.engine.tokenizer, ctx=self.engine.ctx, model_name=self.engine.model_name)

    async def generate(self, routed: Routed):
        """First this replica's name (or the reason the engine refused the request), then lists of Events."""
        try:
            stream = self.engine.submit(routed.request)
        except (ShaderLMError, ValueError) as e:
            yield e
            return
        yield self.name
        try:
            async for ev in stream:
                yield [ev, *stream.ready()]
        finally:                 # done, or cancelled: the client went away
            if not stream.done:
                stream.cancel()

    async def check_health(self):
        if self.engine.stats()["closed"]:
            raise RuntimeError("the engine has stopped")

    def __del__(self):
        self._stop.set()
        self.engine.close()


# ---- the frontend ------------------------------------------------------------------------------------
class RemoteStream:
    """A choice's events from its replica (server/app.py's Stream interface)."""

    def __init__(self, gen, replica: str):
        self._gen, self.replica = gen, replica
        self._cancelled = False

    async def __aiter__(self):
        try:
            async for batch in self._gen:
                for ev in batch:
                    yield ev
        except RequestCancelledError:
            if not self._cancelled:       # not by cancel(): the server is going down
                raise

    def cancel(self):
        self._cancelled = True
        self._gen.cancel()


class RemoteEngine:
    """server/app.py's engine interface over the replicas: submit() goes to the one the router picks;
    stats() sums the replicas' latest reports and lists them."""

    def __init__(self, handle, board, info: dict):
        self.handle, self.board = handle.options(stream=True), board
        self.tokenizer, self.ctx, self.model_name = info["tokenizer"], info["ctx"], info["model_name"]
        self._reports: dict = {}
        self._states: dict = {}
        self._refresher = asyncio.get_running_loop().create_task(self._refresh())

    async def submit(self, request: Request) -> RemoteStream:
        routed = Routed(request, prefixes(request.prompt_ids))
        for attempt in range(3):    # a replica that died before taking the request: another takes it
            gen = self.handle.generate.remote(routed)
            try:
                first = await gen.__anext__()
                break
            except BackPressureError as e:
                raise QueueFullError("every replica is busy and the queue in front of them is full") from e
            except ray.exceptions.RayError as e:
                if attempt == 2:
                    raise EngineClosedError(f"no replica took the request: {e}") from e
                await asyncio.sleep(0.5)
        if isinstance(first, Exception):
            raise first
        return RemoteStream(gen, first)

    async def _refresh(self):
        tick = 0
        while True:
            with contextlib.suppress(Exception):    # a slow or restarting controller: keep the last figures
                self._reports = await self.board.get.remote()
                if tick % 4 == 0:
                    status = await asyncio.to_thread(serve.status)
                    deployment = status.applications[APP].deployments["EngineReplica"]
                    self._states = {str(k): v for k, v in deployment.replica_states.items()}
            tick += 1
            await asyncio.sleep(REPORT_EVERY_S)

    def stats(self) -> dict:
        live = [stats for age, (_, stats) in self._reports.values() if age < STALE_S]
        total = {key: sum(r.get(key, 0) for r in live) for key in {k for r in live for k, v in r.items()
                                                                    if type(v) in (int, float)}}   # not `closed`
        replicas = [dict(facts, **stats, state="ready" if age < STALE_S else "not reporting",
                         last_report_s=round(age, 1)) for age, (facts, stats) in self._reports.values()]
        return dict(total, status="ok" if live else "unavailable", replicas_ready=len(live),
                    replica_states=self._states, replicas=sorted(replicas, key=lambda r: r["replica"]))


class Frontend:
    async def __init__(self, engine, board: str):
        info = await engine.info.remote()
        self.engine = RemoteEngine(engine, ray.get_actor(board, namespace=NAMESPACE), info)

    def __serve_build_asgi_app__(self):
        return create_app(self.engine)


# ---- starting it -----------------------------------------------------------------------------------------
class Replicas:
    """A running application: `url`, and close() to take it down."""

    def __init__(self, url: str, board, started_ray: bool):
        self.url, self._board, self._started_ray = url, board, started_ray

    def close(self):
        with contextlib.suppress(Exception):
            serve.delete(APP)
        with contextlib.suppress(Exception):
            ray.kill(self._board)
        if self._started_ray:
            serve.shutdown()
            ray.shutdown()


def start(model: str | None = None, *, host: str = "127.0.0.1", port: int = 8080, replicas: int = 1,
          min_replicas: int | None = None, max_replicas: int | None = None, devices: list[str] | None = None,
          replicas_per_host: int | None = None, ray_address: str | None = None, parallel: int = 8,
          queue_size: int = 64, access_log: bool = False, **engine_kw) -> Replicas:
    """Start the application (and a local Ray instance unless `ray_address` names a cluster) and return
    once every replica is up. engine_kw: serve_engine's (ctx, kv_pages, quantize, int8_act, ...)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(address=ray_address or "local", namespace=NAMESPACE, include_dashboard=False,
                 logging_level="warning")
    serve.start(http_options={"host": host, "port": port})
    board_name = f"{APP}-stats"
    board = StatsBoard.options(name=board_name, namespace=NAMESPACE, lifetime="detached",
                               get_if_exists=True).remote()
    if min_replicas is not None or max_replicas is not None:
        lo = min_replicas if min_replicas is not None else 1
        scale = dict(autoscaling_config=dict(min_replicas=lo, max_replicas=max(lo, max_replicas or lo),
                                             initial_replicas=max(lo, min(replicas, max_replicas or lo)),
                                             target_ongoing_requests=parallel, upscale_delay_s=10))
    else:
        scale = dict(num_replicas=replicas)
    if replicas_per_host:
        scale["max_replicas_per_node"] = replicas_per_host
    logs = dict(enable_access_log=access_log)     # a line per request and per stream: off unless asked
    router = RequestRouterConfig(request_router_class=PrefixAffinityRouter,
                                 request_router_kwargs=dict(imbalance=max(2, parallel // 4)))
    engines = serve.deployment(EngineReplica).options(
        # each engine queues `queue_size`; the router holds requests while it picks a replica, and when all
        # are full, at most this many (then 429)
        **scale, max_ongoing_requests=parallel + queue_size, max_queued_requests=max(100, queue_size),
        request_router_config=router, health_check_period_s=2, graceful_shutdown_timeout_s=5,
        ray_actor_options={"num_cpus": 0}, logging_config=logs)
    frontend = serve.deployment(serve.ingress()(Frontend)).options(
        name="Frontend", num_replicas=1, max_ongoing_requests=100_000, ray_actor_options={"num_cpus": 0},
        logging_config=logs)
    app = frontend.bind(engines.bind(model, devices, dict(engine_kw, parallel=parallel, queue_size=queue_size),
                                     board_name), board_name)
    try:
        serve.run(app, name=APP, route_prefix="/")
    except BaseException:
        Replicas("", board, started_ray).close()
        raise
    return Replicas(f"http://{host}:{port}", board, started_ray)


def serve_replicas(model: str | None = None, **kw) -> None:
    """Serve until interrupted (Ctrl-C, or SIGTERM as a service manager sends it): then take the application
    down, and Ray with it when this started it."""
    def stop(signum, frame):
        raise KeyboardInterrupt
    app = start(model, **kw)
    signal.signal(signal.SIGTERM, stop)          # after Ray's start, which installs a handler of its own
    print(f"shaderlm: serving on {app.url} through Ray Serve (OpenAI API under /v1, a chat page at /)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        app.close()
