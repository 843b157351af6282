"""A local OpenAI-compatible streaming server playing vLLM + LMCache, for the bench tests.

Several "pods" (one listener each) share one L2; each pod has its own L0 (vLLM's GPU prefix cache,
16-token blocks) and L1 (LMCache CPU cache, 256-token chunks). The timing model is injected:

    TTFT = base + prefill_per_token * computed tokens + (load_fixed + l1/l2 per-token costs) if loaded

Cache semantics follow vLLM v1 + LMCache in-process mode: the GPU cache hit is capped at
``prompt - 1`` tokens and block aligned; LMCache's hit is the run of consecutive chunks found in
L1 or L2 (the trailing partial chunk is stored when ``save_unfull_chunk``); vLLM loads
``lmcache_hit - l0_hit`` tokens (one fewer on a full hit, the last token is recomputed) and counts
them as ``vllm:external_prefix_cache_hits``. Writes to L1/L2 land ``store_delay_ms`` after prefill.

Endpoints: ``/v1/models``, ``/tokenize``, ``/v1/completions`` and ``/v1/chat/completions``
(streaming SSE with ``include_usage``, or plain JSON), ``/metrics`` (vLLM + LMCache Prometheus
text), ``/health``; ``/_fake/requests`` returns the server-side truth per request. LMCache-style
log lines ("Reqid: ..., LMCache hit tokens", "[req_id=...] Retrieved ...", "Stored ...") are
appended to each pod's ``log_path`` when set. An optional router listener spreads completions
round-robin over the pods (and, like the real routing service, has no ``/tokenize``).

Run standalone (the client-overhead benchmark does): ``python -m tests.harness.fake_vllm --pods 1``
prints ``READY <json>`` and serves until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
import zlib
from collections import OrderedDict
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from hpkv.bench.runner import Conn

BOS = 1
IM_START, IM_END = 2, 3
ROLE_IDS = {"system": 4, "user": 5, "assistant": 6}
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0]
LMCACHE_TIME_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 10.0]
OUTPUT_WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]


@dataclass
class Costs:
    base_ms: float = 5.0
    prefill_ms_per_token: float = 0.2
    load_fixed_ms: float = 2.0
    l1_ms_per_token: float = 0.005
    l2_ms_per_token: float = 0.02
    itl_ms: float = 2.0
    store_delay_ms: float = 20.0
    jitter_ms: float = 0.0  # uniform extra TTFT in [0, jitter_ms), seeded per request id

    def retrieve_ms(self, l1_tokens: int, l2_tokens: int) -> float:
        return (
            self.load_fixed_ms + self.l1_ms_per_token * l1_tokens + self.l2_ms_per_token * l2_tokens
        )

    def ttft_ms(self, computed: int, retrieve_ms: float) -> float:
        return self.base_ms + self.prefill_ms_per_token * computed + retrieve_ms


def word_id(word: str) -> int:
    return (zlib.crc32(word.encode()) & 0xFFFFFF) + 16


def tokenize_text(text: str, *, bos: bool = True) -> list[int]:
    return ([BOS] if bos else []) + [word_id(w) for w in text.split()]


def tokenize_messages(
    messages: list[dict[str, Any]], *, generation_prompt: bool = True
) -> list[int]:
    tokens: list[int] = []
    for message in messages:
        content = message.get("content") or ""
        if isinstance(content, list):
            content = " ".join(part.get("text", "") for part in content if isinstance(part, dict))
        tokens += [IM_START, ROLE_IDS.get(message.get("role", "user"), 7)]
        tokens += [word_id(w) for w in str(content).split()]
        tokens.append(IM_END)
    if generation_prompt:
        tokens += [IM_START, ROLE_IDS["assistant"]]
    return tokens


def chain_hashes(tokens: list[int], size: int, *, partial: bool) -> list[tuple[int, int]]:
    """(hash, token count) per block/chunk, each hash chained on the previous one."""
    out = []
    parent = 0
    end = len(tokens) if partial else len(tokens) - len(tokens) % size
    for start in range(0, end, size):
        piece = tuple(tokens[start : min(start + size, end)])
        parent = hash((parent, piece))
        out.append((parent, len(piece)))
    return out


class Histogram:
    def __init__(self, buckets: list[float]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.sum += value
        self.count += 1
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out = [f"# TYPE {name} histogram"]
        for bound, count in zip(self.buckets, self.counts, strict=True):
            out.append(f'{name}_bucket{{{labels},le="{bound}"}} {float(count)}')
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {float(self.count)}')
        out.append(f"{name}_sum{{{labels}}} {self.sum!r}")
        out.append(f"{name}_count{{{labels}}} {float(self.count)}")
        return out


@dataclass
class Truth:
    """What the server did for one request (the injected numbers the bench must recover)."""

    id: str
    pod: str
    prompt_tokens: int
    output_tokens: int
    l0_hit: int
    lmcache_hit: int
    external_hit: int
    computed: int
    l1_tokens: int
    l2_tokens: int
    l2_bytes: int
    retrieve_ms: float | None
    ttft_model_ms: float
    ttft_true_ms: float = 0.0
    via_router: bool = False


class FakePod:
    def __init__(self, cluster: FakeCluster, name: str, host: str, port: int) -> None:
        self.cluster = cluster
        self.name = name
        self.host = host
        self.port = port
        self.l0: OrderedDict[int, None] = OrderedDict()
        self.l1: OrderedDict[int, None] = OrderedDict()
        self.counters: dict[str, float] = {}
        self.ttft = Histogram(TTFT_BUCKETS)
        self.retrieve = Histogram(LMCACHE_TIME_BUCKETS)
        self.store = Histogram(LMCACHE_TIME_BUCKETS)
        self.truth: list[Truth] = []
        self.log_path: Path | None = None
        self.server: _Listener | None = None
        self.running = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def add(self, name: str, value: float) -> None:
        self.counters[name] = self.counters.get(name, 0.0) + value

    def log(self, message: str) -> None:
        if self.log_path is None:
            return
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
        with self.log_path.open("a", encoding="utf-8") as handle:
            handle.write(f"[{stamp},000] LMCache INFO: {message}\n")

    # --- cache model -------------------------------------------------------------------------
    def l0_hit(self, tokens: list[int]) -> int:
        size = self.cluster.block_size
        hit = 0
        for block_hash, count in chain_hashes(tokens, size, partial=False):
            if block_hash not in self.l0:
                break
            self.l0.move_to_end(block_hash)
            hit += count
        cap = (len(tokens) - 1) // size * size
        return min(hit, cap)

    def lmcache_lookup(self, tokens: list[int]) -> list[tuple[int, int, str]]:
        """Consecutive chunks found: (hash, tokens, 'l1'|'l2')."""
        found = []
        if not self.cluster.lmcache:
            return found
        for chunk_hash, count in chain_hashes(
            tokens, self.cluster.chunk_size, partial=self.cluster.save_unfull_chunk
        ):
            if chunk_hash in self.l1:
                found.append((chunk_hash, count, "l1"))
            elif self.cluster.l2_enabled and chunk_hash in self.cluster.l2:
                found.append((chunk_hash, count, "l2"))
            else:
                break
        return found

    def plan(self, rid: str, tokens: list[int]) -> Truth:
        costs = self.cluster.costs
        n = len(tokens)
        l0 = self.l0_hit(tokens)
        chunks = self.lmcache_lookup(tokens)
        lm_hit = sum(count for _h, count, _where in chunks)
        need = lm_hit - l0
        if lm_hit == n:
            need -= 1
        external = max(0, need)
        l1_tokens = l2_tokens = 0
        retrieve_ms = None
        if external > 0:
            skip_to = l0 // self.cluster.chunk_size * self.cluster.chunk_size
            position = 0
            for chunk_hash, count, where in chunks:
                if position + count > skip_to:
                    if where == "l1":
                        l1_tokens += count
                    else:
                        l2_tokens += count
                        self._l1_put(chunk_hash)
                position += count
            retrieve_ms = costs.retrieve_ms(l1_tokens, l2_tokens)
        computed = n - l0 - external
        ttft = costs.ttft_ms(computed, retrieve_ms or 0.0)
        if costs.jitter_ms:
            ttft += (zlib.crc32(rid.encode()) % 10_000) / 10_000 * costs.jitter_ms
        return Truth(
            id=rid,
            pod=self.name,
            prompt_tokens=n,
            output_tokens=0,
            l0_hit=l0,
            lmcache_hit=lm_hit,
            external_hit=external,
            computed=computed,
            l1_tokens=l1_tokens,
            l2_tokens=l2_tokens,
            l2_bytes=l2_tokens * self.cluster.kv_bytes_per_token,
            retrieve_ms=retrieve_ms,
            ttft_model_ms=ttft,
        )

    def _l1_put(self, chunk_hash: int) -> None:
        if not self.cluster.l1_enabled:
            return
        self.l1[chunk_hash] = None
        self.l1.move_to_end(chunk_hash)
        while len(self.l1) > self.cluster.l1_chunks:
            self.l1.popitem(last=False)

    def account_prefill(self, truth: Truth, rid_internal: str) -> None:
        n = truth.prompt_tokens
        self.add("vllm:prefix_cache_queries_total", n)
        self.add("vllm:prefix_cache_hits_total", truth.l0_hit)
        self.add("vllm:prompt_tokens_total", n)
        if self.cluster.lmcache:
            self.add("vllm:external_prefix_cache_queries_total", n)
            self.add("vllm:external_prefix_cache_hits_total", truth.external_hit)
            self.add("lmcache:num_lookup_requests_total", 1)
            self.add("lmcache:num_requested_tokens_total", n)
            self.add("lmcache:num_hit_tokens_total", truth.lmcache_hit)
            self.log(
                f"Reqid: {rid_internal}, Total tokens {n}, Inference Engine computed tokens: "
                f"{truth.l0_hit}, LMCache hit tokens: {truth.lmcache_hit}, need to load: "
                f"{truth.external_hit}"
            )
            if truth.retrieve_ms is not None:
                self.add("lmcache:num_retrieve_requests_total", 1)
                self.retrieve.observe(truth.retrieve_ms / 1000.0)
                if truth.l2_tokens:
                    chunks = -(-truth.l2_tokens // self.cluster.chunk_size)
                    self.add("lmcache:num_remote_read_requests_total", chunks)
                    self.add("lmcache:num_remote_read_bytes_total", truth.l2_bytes)
                retrieved = truth.l1_tokens + truth.l2_tokens
                size = retrieved * self.cluster.kv_bytes_per_token
                self.log(
                    f"[req_id={rid_internal}] Retrieved {retrieved} out of {truth.external_hit} "
                    f"required tokens (from {n} total tokens). size: {size / 1024**3:.4f} gb, "
                    f"cost {truth.retrieve_ms:.4f} ms, throughput: "
                    f"{size / (truth.retrieve_ms / 1000) / 1024**3:.4f} GB/s;"
                )

    def cache_after_prefill(self, tokens: list[int], rid_internal: str) -> None:
        for block_hash, _count in chain_hashes(tokens, self.cluster.block_size, partial=False):
            self.l0[block_hash] = None
            self.l0.move_to_end(block_hash)
        while len(self.l0) > self.cluster.l0_blocks:
            self.l0.popitem(last=False)
        if self.cluster.lmcache:
            loop = asyncio.get_running_loop()
            loop.call_later(
                self.cluster.costs.store_delay_ms / 1000.0, self._store, tokens, rid_internal
            )

    def _store(self, tokens: list[int], rid_internal: str) -> None:
        stored = 0
        written_chunks = 0
        for chunk_hash, count in chain_hashes(
            tokens, self.cluster.chunk_size, partial=self.cluster.save_unfull_chunk
        ):
            stored += count
            self._l1_put(chunk_hash)
            if self.cluster.l2_enabled and chunk_hash not in self.cluster.l2:
                self.cluster.l2[chunk_hash] = None
                written_chunks += 1
                self.add("lmcache:num_remote_write_requests_total", 1)
                self.add(
                    "lmcache:num_remote_write_bytes_total", count * self.cluster.kv_bytes_per_token
                )
        self.add("lmcache:num_store_requests_total", 1)
        self.add("lmcache:num_stored_tokens_total", stored)
        delay = self.cluster.costs.store_delay_ms
        self.store.observe(delay / 1000.0)
        size = stored * self.cluster.kv_bytes_per_token
        self.log(
            f"[req_id={rid_internal}] Stored {stored} out of total {len(tokens)} tokens. size: "
            f"{size / 1024**3:.4f} GB, cost {delay:.4f} ms, throughput: "
            f"{size / max(delay, 1e-6) * 1000 / 1024**3:.4f} GB/s; offload_time: 0.0000 ms, "
            f"put_time: {delay:.4f} ms"
        )

    # --- metrics -----------------------------------------------------------------------------
    def metrics_text(self) -> str:
        model = self.cluster.model
        vlabels = f'engine="0",model_name="{model}"'
        llabels = f'model_name="{model}",role="worker",served_model_name="{model}",worker_id="0"'
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{vlabels}}} {float(self.running)}",
        ]
        vllm_counters = [
            "vllm:prefix_cache_queries_total",
            "vllm:prefix_cache_hits_total",
            "vllm:prompt_tokens_total",
            "vllm:generation_tokens_total",
        ]
        if self.cluster.lmcache:
            vllm_counters += [
                "vllm:external_prefix_cache_queries_total",
                "vllm:external_prefix_cache_hits_total",
            ]
        for name in vllm_counters:
            lines += [
                f"# TYPE {name[:-6]} counter",
                f"{name}{{{vlabels}}} {self.counters.get(name, 0.0)}",
            ]
        lines += self.ttft.lines("vllm:time_to_first_token_seconds", vlabels)
        if self.cluster.lmcache:
            for name in (
                "lmcache:num_retrieve_requests_total",
                "lmcache:num_store_requests_total",
                "lmcache:num_lookup_requests_total",
                "lmcache:num_requested_tokens_total",
                "lmcache:num_hit_tokens_total",
                "lmcache:num_stored_tokens_total",
                "lmcache:num_remote_read_requests_total",
                "lmcache:num_remote_read_bytes_total",
                "lmcache:num_remote_write_requests_total",
                "lmcache:num_remote_write_bytes_total",
            ):
                lines += [
                    f"# TYPE {name[:-6]} counter",
                    f"{name}{{{llabels}}} {self.counters.get(name, 0.0)}",
                ]
            if self.cluster.retrieve_histogram:
                lines += self.retrieve.lines("lmcache:time_to_retrieve", llabels)
            lines += self.store.lines("lmcache:time_to_store", llabels)
        return "\n".join(lines) + "\n"


@dataclass
class FakeCluster:
    """Pods + shared L2 + optional router, served from one event loop (thread or main)."""

    pods: int = 2
    model: str = "Qwen/Qwen2-7B-Instruct"
    costs: Costs = field(default_factory=Costs)
    hosts: list[str] | None = None  # one host per pod (e.g. 127.0.0.2, 127.0.0.3)
    port: int = 0  # 0: a free port per pod; else the same port on every host
    router: bool = True
    block_size: int = 16
    chunk_size: int = 256
    save_unfull_chunk: bool = True
    lmcache: bool = True
    l1_enabled: bool = True
    l2_enabled: bool = True
    l0_blocks: int = 1 << 30
    l1_chunks: int = 1 << 30
    kv_bytes_per_token: int = 57344
    precise: bool = True
    tokenize_endpoint: bool = True
    retrieve_histogram: bool = True  # False: LMCache versions without lmcache:time_to_retrieve
    max_model_len: int = 32768
    names: list[str] | None = None  # pod names (default pod-0, pod-1, ...)
    log_paths: list[str] | None = None  # LMCache log file per pod
    process: bool = False  # serve from a child process (its own GIL) instead of a thread

    def __post_init__(self) -> None:
        self.l2: OrderedDict[int, None] = OrderedDict()
        self.members: list[FakePod] = []
        self.router_port = 0
        self.router_host = "127.0.0.1"
        self._rr = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._servers: list[_Listener] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._switch_interval = sys.getswitchinterval()
        self._proc: subprocess.Popen[str] | None = None

    # --- lifecycle -----------------------------------------------------------------------------
    async def serve(self) -> None:
        hosts = self.hosts or ["127.0.0.1"] * self.pods
        for i in range(self.pods):
            pod = FakePod(self, self.names[i] if self.names else f"pod-{i}", hosts[i], self.port)
            if self.log_paths:
                pod.log_path = Path(self.log_paths[i])
            server = await self._listen(pod, hosts[i], self.port)
            pod.port = server.port
            pod.server = server
            self._servers.append(server)
            self.members.append(pod)
        if self.router:
            server = await self._listen(None, self.router_host, 0)
            self.router_port = server.port
            self._servers.append(server)

    def start(self) -> FakeCluster:
        if self.process:
            return self._start_process()
        # In a thread the server shares the GIL with the test (and with hpkv itself when it runs
        # in-process): a short switch interval keeps its clocks from waiting ~5 ms for the GIL.
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(0.0002)
        ready = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.serve())
            except BaseException as exc:
                errors.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            for server in self._servers:
                server.close()
            loop.run_until_complete(asyncio.sleep(0))
            loop.close()

        self._thread = threading.Thread(target=run, name="fake-vllm", daemon=True)
        self._thread.start()
        ready.wait(30)
        if errors:
            raise errors[0]
        return self

    def _start_process(self) -> FakeCluster:
        config = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "process"}
        config["costs"] = asdict(self.costs)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.harness.fake_vllm", "--config", json.dumps(config)],
            cwd=Path(__file__).resolve().parents[2],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line.startswith("READY "):
            self._proc.kill()
            raise RuntimeError(f"fake vLLM process did not start: {line!r}")
        info = json.loads(line[len("READY ") :])
        self.members = [FakePod(self, m["name"], m["host"], m["port"]) for m in info["members"]]
        self.router_port = info["router_port"]
        return self

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(10)
            self._proc = None
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            sys.setswitchinterval(self._switch_interval)

    def __enter__(self) -> FakeCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def call(self, fn: Any, *args: Any) -> Any:
        """Run ``fn`` on the server loop (for tests that change state while it serves)."""
        assert self._loop is not None
        done = threading.Event()
        box: list[Any] = []
        self._loop.call_soon_threadsafe(lambda: (box.append(fn(*args)), done.set()))
        done.wait(10)
        return box[0] if box else None

    # --- access ------------------------------------------------------------------------------
    @property
    def router_url(self) -> str:
        return f"http://{self.router_host}:{self.router_port}"

    def pod(self, index: int) -> FakePod:
        return self.members[index]

    def truth(self) -> list[Truth]:
        return sorted(self._all_truth(), key=lambda t: t.id)

    def truth_by_id(self) -> dict[str, Truth]:
        return {t.id: t for t in self._all_truth()}

    def _all_truth(self) -> list[Truth]:
        if not self.process:
            return [t for p in self.members for t in p.truth]
        found = []
        for pod in self.members:
            with urllib.request.urlopen(pod.url + "/_fake/requests", timeout=30) as response:
                found += [Truth(**t) for t in json.load(response)]
        return found

    # --- HTTP --------------------------------------------------------------------------------
    async def _listen(self, pod: FakePod | None, host: str, port: int) -> _Listener:
        """Accept on raw sockets read through the runner's ``Conn``: a request's arrival is the
        kernel's receive time of its last bytes, not when this loop got to it."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(1024)
        listener.setblocking(False)
        loop = asyncio.get_running_loop()

        async def accept() -> None:
            while True:
                sock, _address = await loop.sock_accept(listener)
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn = Conn(loop, sock)
                task = loop.create_task(self._connection(conn, _Writer(conn), pod))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

        return _Listener(listener, loop.create_task(accept()))

    async def _connection(self, conn: Conn, writer: _Writer, pod: FakePod | None) -> None:
        try:
            while True:
                try:
                    head = await conn.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, target, _version = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        key, _, value = line.partition(":")
                        headers[key.strip().lower()] = value.strip()
                length = int(headers.get("content-length", "0") or 0)
                body = await conn.readexactly(length) if length else b""
                received = conn.last_at  # when the request's last bytes reached this server
                keep = await self._dispatch(writer, pod, method, target, body, received)
                if not keep or headers.get("connection", "").lower() == "close":
                    return
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            return
        finally:
            writer.close()

    async def _dispatch(
        self,
        writer: _Writer,
        pod: FakePod | None,
        method: str,
        target: str,
        body: bytes,
        received: float,
    ) -> bool:
        path = target.split("?", 1)[0]
        if path in ("/v1/completions", "/v1/chat/completions") and method == "POST":
            serving = pod
            via_router = pod is None
            if serving is None:
                serving = self.members[self._rr % len(self.members)]
                self._rr += 1
            return await self._completion(writer, serving, path, body, received, via_router)
        if path == "/health":
            return await _respond(writer, 200, b"")
        if path == "/v1/models":
            data = {
                "object": "list",
                "data": [
                    {"id": self.model, "object": "model", "max_model_len": self.max_model_len}
                ],
            }
            return await _respond_json(writer, 200, data)
        if pod is None:
            return await _respond_json(writer, 404, {"detail": "Not Found"})
        if path == "/metrics":
            return await _respond(
                writer, 200, pod.metrics_text().encode(), "text/plain; version=0.0.4"
            )
        if path == "/tokenize" and method == "POST" and self.tokenize_endpoint:
            request = json.loads(body or b"{}")
            tokens = self._tokens(request)
            return await _respond_json(
                writer,
                200,
                {"count": len(tokens), "max_model_len": self.max_model_len, "tokens": tokens},
            )
        if path == "/_fake/requests":
            return await _respond_json(writer, 200, [asdict(t) for t in pod.truth])
        return await _respond_json(writer, 404, {"detail": "Not Found"})

    def _tokens(self, request: dict[str, Any]) -> list[int]:
        if "messages" in request:
            return tokenize_messages(
                request["messages"], generation_prompt=request.get("add_generation_prompt", True)
            )
        prompt = request.get("prompt", "")
        if isinstance(prompt, list):
            return list(prompt)
        return tokenize_text(prompt, bos=request.get("add_special_tokens", True))

    async def _completion(
        self,
        writer: _Writer,
        pod: FakePod,
        path: str,
        body: bytes,
        received: float,
        via_router: bool,
    ) -> bool:
        request = json.loads(body)
        chat = path.endswith("chat/completions")
        if request.get("model") not in (None, self.model):
            error = {
                "error": {
                    "message": f"The model `{request.get('model')}` does not exist.",
                    "type": "NotFoundError",
                    "code": 404,
                }
            }
            return await _respond_json(writer, 404, error)
        tokens = self._tokens(request)
        if len(tokens) >= self.max_model_len:
            return await _respond_json(
                writer, 400, {"error": {"message": "prompt too long", "code": 400}}
            )
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        internal = f"{rid}-0"
        truth = pod.plan(rid, tokens)
        truth.via_router = via_router
        max_tokens = int(request.get("max_tokens") or 16)
        pod.running += 1
        try:
            deadline = received + truth.ttft_model_ms / 1000.0
            stream = bool(request.get("stream"))
            words = [OUTPUT_WORDS[i % len(OUTPUT_WORDS)] for i in range(max_tokens)]
            if not stream:
                await self._sleep_until(deadline)
                truth.ttft_true_ms = (time.time() - received) * 1000.0
                self._finish_prefill(pod, truth, tokens, internal)
                await self._sleep_until(deadline + self.costs.itl_ms * (max_tokens - 1) / 1000.0)
                truth.output_tokens = max_tokens
                pod.add("vllm:generation_tokens_total", max_tokens)
                text = "".join(" " + w for w in words)
                choice = {"index": 0, "finish_reason": "length"}
                choice.update(
                    {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
                )
                data = {
                    "id": rid,
                    "object": "chat.completion" if chat else "text_completion",
                    "model": self.model,
                    "choices": [choice],
                    "usage": _usage(len(tokens), max_tokens),
                }
                return await _respond_json(writer, 200, data)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                b"transfer-encoding: chunked\r\n\r\n"
            )
            created = int(time.time())
            obj = "chat.completion.chunk" if chat else "text_completion"
            if chat:
                first = {
                    "id": rid,
                    "object": obj,
                    "created": created,
                    "model": self.model,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                    "usage": None,
                }
                await _chunk(writer, _sse(first))
            await self._sleep_until(deadline)
            for i, word in enumerate(words):
                last = i == len(words) - 1
                if chat:
                    choice = {
                        "index": 0,
                        "delta": {"content": " " + word},
                        "logprobs": None,
                        "finish_reason": "length" if last else None,
                    }
                else:
                    choice = {
                        "index": 0,
                        "text": " " + word,
                        "logprobs": None,
                        "finish_reason": "length" if last else None,
                        "stop_reason": None,
                    }
                event = {
                    "id": rid,
                    "object": obj,
                    "created": created,
                    "model": self.model,
                    "choices": [choice],
                    "usage": None,
                }
                if i == 0:  # stamped just before the send: the token leaves now
                    truth.ttft_true_ms = (time.time() - received) * 1000.0
                writer.write(_frame(_sse(event)))
                if i == 0:
                    self._finish_prefill(pod, truth, tokens, internal)
                await writer.drain()
                if not last:
                    await self._sleep_until(deadline + self.costs.itl_ms * (i + 1) / 1000.0)
            truth.output_tokens = len(words)
            pod.add("vllm:generation_tokens_total", len(words))
            options = request.get("stream_options") or {}
            if options.get("include_usage"):
                usage = {
                    "id": rid,
                    "object": obj,
                    "created": created,
                    "model": self.model,
                    "choices": [],
                    "usage": _usage(len(tokens), len(words)),
                }
                writer.write(_frame(_sse(usage)))
            writer.write(_frame(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            await writer.drain()
            return True
        finally:
            pod.running -= 1

    def _finish_prefill(self, pod: FakePod, truth: Truth, tokens: list[int], internal: str) -> None:
        pod.truth.append(truth)
        pod.ttft.observe(truth.ttft_true_ms / 1000.0)
        pod.account_prefill(truth, internal)
        pod.cache_after_prefill(tokens, internal)

    async def _sleep_until(self, deadline: float) -> None:
        # asyncio.sleep wakes up to ~1 ms late (epoll's millisecond timeout); precise mode sleeps
        # short of the deadline, then finishes with sub-millisecond sleeps that release the GIL.
        remaining = deadline - time.time()  # deadlines are wall clock, like arrival times
        if remaining <= 0:
            return
        if not self.precise:
            await asyncio.sleep(remaining)
            return
        if remaining > 0.0015:
            await asyncio.sleep(remaining - 0.0015)
        while time.time() < deadline:
            time.sleep(0.0001)


class _Listener:
    def __init__(self, sock: socket.socket, task: asyncio.Task[None]) -> None:
        self.sock, self.task = sock, task
        self.port = sock.getsockname()[1]

    def close(self) -> None:
        self.task.cancel()
        self.sock.close()


class _Writer:
    """Writes of a fake server connection: sent at once, the rest when drained."""

    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        self.pending = b""

    def write(self, data: bytes) -> None:
        if self.pending:
            self.pending += data
            return
        try:
            sent = self.conn.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        self.pending = data[sent:]

    async def drain(self) -> None:
        if self.pending:
            data, self.pending = self.pending, b""
            await self.conn.loop.sock_sendall(self.conn.sock, data)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.close()


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
    }


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _frame(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _chunk(writer: _Writer, data: bytes) -> None:
    writer.write(_frame(data))
    await writer.drain()


async def _respond(
    writer: _Writer, status: int, body: bytes, content_type: str = "application/json"
) -> bool:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(status, "Error")
    writer.write(
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    return True


async def _respond_json(writer: _Writer, status: int, data: Any) -> bool:
    return await _respond(writer, status, json.dumps(data).encode())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fake vLLM + LMCache server")
    parser.add_argument("--pods", type=int, default=1)
    parser.add_argument("--base-ms", type=float, default=5.0)
    parser.add_argument("--prefill-ms-per-token", type=float, default=0.2)
    parser.add_argument("--itl-ms", type=float, default=2.0)
    parser.add_argument("--jitter-ms", type=float, default=0.0)
    parser.add_argument("--precise", action="store_true")
    parser.add_argument("--config", help="FakeCluster fields as JSON (overrides the flags)")
    args = parser.parse_args(argv)
    if args.config:
        config = json.loads(args.config)
        config["costs"] = Costs(**config["costs"])
        return _serve_forever(FakeCluster(**config))
    costs = Costs(
        base_ms=args.base_ms,
        prefill_ms_per_token=args.prefill_ms_per_token,
        itl_ms=args.itl_ms,
        jitter_ms=args.jitter_ms,
    )
    return _serve_forever(FakeCluster(pods=args.pods, costs=costs, precise=args.precise))


def _serve_forever(cluster: FakeCluster) -> int:
    async def run() -> None:
        await cluster.serve()
        info = {
            "pods": [p.url for p in cluster.members],
            "router": cluster.router_url,
            "router_port": cluster.router_port,
            "members": [{"name": p.name, "host": p.host, "port": p.port} for p in cluster.members],
        }
        sys.stdout.write("READY " + json.dumps(info) + "\n")
        sys.stdout.flush()
        await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
