"""``hpkv simulate``: replay a workload against N replicas with three cache tiers and compare
routing strategies.

Model, per replica: an L0 block cache (vLLM prefix cache: 16-token blocks, LRU) and an L1 chunk
cache (LMCache CPU: 256-token chunks, LRU); one shared L2 (chunks, capacity with LRU, and a TTL
counted from the write, as Curvine counts from mtime). A request hits the longest run of leading
blocks in L0; LMCache then serves the longest run of leading chunks found in L1 or L2 beyond
that, copying chunks read from L2 into L1; the rest is recomputed, and LMCache stores the chunks
it did not find (whole chunks only; the last prompt token is always recomputed). A lookup
refreshes what it matched.

Every tier records a request's prompt tail first, so the tail is evicted first and a partly
evicted prompt keeps its leading blocks or chunks. That is how vLLM frees blocks; LMCache
refreshes chunks in prompt order, which can strand a prompt's tail behind an evicted head, so
for L1 and L2 this keeps the reachable part a little more often than LMCache would.

Caches hold whole segments (see :mod:`hpkv.sizing.workload`) with a count of resident leading
units, which gives exactly the block-by-block results (tests compare both) except that a segment
read partly from L2 is copied to L1 whole.

TTFT per request = waiting behind earlier prefills on the same replica + the cost model's TTFT
(:class:`hpkv.sizing.costmodel.CostModel`). Decode work is not queued.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import random
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from hpkv.errors import UsageError
from hpkv.sizing import STRATEGIES
from hpkv.sizing.costmodel import CostModel
from hpkv.sizing.workload import Node, Request

_HIST_RATIO = 1.02  # TTFT histogram bins grow by 2%: percentiles within 1%
_HIST_K = 1 / math.log(_HIST_RATIO)
_HIST_BINS = int(math.log(1e7) * _HIST_K) + 1  # 1 ms .. 10^7 ms


@dataclass(frozen=True)
class ClusterSpec:
    replicas: int
    l0_blocks: int  # per replica
    l1_chunks: int  # per replica
    l2_chunks: int  # shared
    l2_ttl_s: float = 0.0  # 0: no TTL
    block_tokens: int = 16
    chunk_tokens: int = 256
    kvaware_threshold: int = 2000  # production-stack --kv-aware-threshold
    prefix_trie_segments: int = 1 << 18  # bound on the prefixaware router's memory
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "replicas": self.replicas,
            "l0BlocksPerReplica": self.l0_blocks,
            "l1ChunksPerReplica": self.l1_chunks,
            "l2Chunks": self.l2_chunks,
            "l2TtlSeconds": self.l2_ttl_s,
            "blockTokens": self.block_tokens,
            "chunkTokens": self.chunk_tokens,
            "kvawareThreshold": self.kvaware_threshold,
        }


@dataclass(frozen=True)
class Timing:
    """The cost model reduced to constants for the inner loop (milliseconds)."""

    overhead: float
    per_token: float  # prefill, per new token
    per_token_pair: float  # prefill attention, per (position x earlier position)
    floor: float  # one pass over the weights
    l1_per_token: float
    l2_per_token: float
    l2_latency: float

    @classmethod
    def from_cost(cls, cost: CostModel) -> Timing:
        flops_ms = cost.effective_flops / 1000
        kv = cost.kv_bytes_per_token
        return cls(
            overhead=cost.params.overhead_ms,
            per_token=2 * cost.model.matmul_params / flops_ms,
            per_token_pair=2 * cost.model.layers * cost.attention_width / flops_ms,
            floor=cost.weight_pass_ms,
            l1_per_token=kv / (cost.params.l1_read_gbps * 1e6),
            l2_per_token=kv / (cost.l2_read_gbytes * 1e6),
            l2_latency=cost.params.l2_latency_ms,
        )


def _mix64(x: int) -> int:
    """splitmix64: a fast, fixed hash of an int (Python's hash() of str is salted per process)."""
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def _session_int(session: Any) -> int:
    if isinstance(session, int):
        return session
    return int.from_bytes(hashlib.blake2b(str(session).encode(), digest_size=8).digest(), "big")


class ConsistentHash:
    """A hash ring with virtual nodes per replica, as the session router's uhashring."""

    def __init__(self, replicas: int, vnodes: int = 160) -> None:
        points = []
        for replica in range(replicas):
            for v in range(vnodes):
                digest = hashlib.md5(f"replica-{replica}-{v}".encode()).digest()
                points.append((int.from_bytes(digest[:8], "big"), replica))
        points.sort()
        self._keys = [p for p, _r in points]
        self._owners = [r for _p, r in points]

    def __call__(self, key: int) -> int:
        i = bisect.bisect(self._keys, _mix64(key))
        return self._owners[i if i < len(self._keys) else 0]


class Cluster:
    """One routing strategy's replicas, tiers, counters and TTFT histogram."""

    def __init__(self, strategy: str, spec: ClusterSpec, timing: Timing) -> None:
        if strategy not in STRATEGIES:
            raise UsageError(
                f"unknown routing strategy '{strategy}'", fix=f"use one of {', '.join(STRATEGIES)}"
            )
        n = spec.replicas
        self.strategy = strategy
        self.spec = spec
        self.timing = timing
        self.l0: list[OrderedDict[int, int]] = [OrderedDict() for _ in range(n)]
        self.l1: list[OrderedDict[int, int]] = [OrderedDict() for _ in range(n)]
        self.l2: OrderedDict[int, int] = OrderedDict()
        self.l2_written: dict[int, float] = {}
        self.l0_used = [0] * n
        self.l1_used = [0] * n
        self.l2_used = 0
        self.busy_until = [0.0] * n
        self.busy_ms = [0.0] * n
        self.routed = [0] * n
        self.tokens_l0 = 0
        self.tokens_l1 = 0
        self.tokens_l2 = 0
        self.recomputed = 0
        self.l2_chunks_written = 0
        self.ttft_sum = 0.0
        self.ttft_max = 0.0
        self.first_t: float | None = None  # set by run()
        self.last_t = 0.0
        self.histogram = [0] * _HIST_BINS
        self._rr = 0
        self._ring = ConsistentHash(n)
        self._sessions: dict[Any, int] = {}
        self._rng = random.Random(spec.seed)
        self._trie: OrderedDict[int, int] = OrderedDict()
        self._all_replicas = (1 << n) - 1
        self._replica_ids = range(n)
        self.route: Callable[[Any, tuple[Node, ...], int], int] = getattr(
            self, "_route_" + strategy
        )
        # bound methods and constants the inner loop unpacks in one go
        self._ops = [
            (l0, l0.get, l0.move_to_end, l1, l1.get, l1.move_to_end)
            for l0, l1 in zip(self.l0, self.l1, strict=True)
        ]
        self._l1_gets = [l1.get for l1 in self.l1]
        self._kvaware_chunk = spec.chunk_tokens
        self._kvaware_threshold = spec.kvaware_threshold
        self._consts = (
            spec.block_tokens,
            spec.chunk_tokens,
            spec.l2_ttl_s,
            spec.l0_blocks,
            spec.l1_chunks,
            spec.l2_chunks,
        )
        self._timing = (
            timing.overhead,
            timing.per_token,
            timing.per_token_pair,
            timing.floor,
            timing.l1_per_token,
            timing.l2_per_token,
            timing.l2_latency,
        )

    # --- routing ------------------------------------------------------------------------------
    def _route_roundrobin(self, session: Any, path: tuple[Node, ...], prompt: int) -> int:
        replica = self._rr % self.spec.replicas
        self._rr += 1
        return replica

    def _route_session(self, session: Any, path: tuple[Node, ...], prompt: int) -> int:
        if session is None:  # no session key: the least busy replica
            return min(range(self.spec.replicas), key=self.busy_until.__getitem__)
        replica = self._sessions.get(session)
        if replica is None:
            if len(self._sessions) >= 1 << 16:  # a memo, bounded
                self._sessions.clear()
            replica = self._sessions[session] = self._ring(_session_int(session))
        return replica

    def _route_prefixaware(self, session: Any, path: tuple[Node, ...], prompt: int) -> int:
        """production-stack's HashTrie: longest recorded prefix, random among ties, then record
        the prompt for the chosen replica; it assumes nothing was evicted."""
        trie = self._trie
        candidates = self._all_replicas
        for node_id, _end, _blocks, _chunks in path:
            owners = trie.get(node_id)
            if owners is None or not owners & candidates:
                break
            candidates &= owners
        if candidates & (candidates - 1):  # several: a random one, as upstream
            replica = self._rng.choice([r for r in self._replica_ids if candidates >> r & 1])
        else:
            replica = candidates.bit_length() - 1
        bit = 1 << replica
        for node_id, _end, _blocks, _chunks in path:
            trie[node_id] = trie.get(node_id, 0) | bit
        while len(trie) > self.spec.prefix_trie_segments:
            trie.popitem(last=False)
        return replica

    def _route_kvaware(self, session: Any, path: tuple[Node, ...], prompt: int) -> int:
        """production-stack's kvaware: the replica whose LMCache holds the longest prefix, unless
        that match is shorter than the prompt minus the threshold; then session routing. Ties go
        to the session's replica when it is among them, else to the first."""
        # A replica without the first segment's chunks scores 0 (most of them, most of the time).
        first = path[0][0] if path and path[0][3] else None
        scores = []
        for get in self._l1_gets:
            if first is not None and not get(first, 0):
                scores.append(0)
                continue
            chunks = 0
            for node_id, _end, _blocks, units in path:
                got = get(node_id, 0)
                if got < units:
                    chunks += got
                    break
                chunks += units
            scores.append(chunks)
        top = max(scores)
        preferred = self._route_session(session, path, prompt)
        if top == 0 or top * self._kvaware_chunk < prompt - self._kvaware_threshold:
            return preferred
        return preferred if scores[preferred] == top else scores.index(top)

    # --- one request --------------------------------------------------------------------------
    def step(
        self, t: float, session: Any, path: tuple[Node, ...], prompt: int, output: tuple[Node, ...]
    ) -> None:
        replica = self.route(session, path, prompt)
        l0, l0_get, l0_move, l1, l1_get, l1_move = self._ops[replica]
        l2 = self.l2
        l2_get, l2_move = l2.get, l2.move_to_end
        block, chunk, ttl, cap0, cap1, cap2 = self._consts
        last = prompt - 1

        # L0: the longest run of leading blocks; stop0 = index of the first incomplete segment.
        h0 = stop0 = 0
        for node_id, _end, units, _chunks in path:
            if units:
                got = l0_get(node_id, 0)
                if got < units:
                    h0 += got
                    break
                h0 += units
            stop0 += 1
        h0 *= block
        if h0 > last:
            h0 = last // block * block

        # LMCache: the longest run of leading chunks in L1 or L2, read beyond what L0 holds.
        written = self.l2_written
        from_l1 = from_l2 = matched = stop1 = 0
        l2_last = False  # whether the last chunk matched came from L2
        via_l2: dict[int, int] | None = None  # index -> chunks L1 held, for segments from L2
        for node_id, _end, _blocks, units in path:
            if units:
                in_l1 = l1_get(node_id, 0)
                if in_l1 >= units:
                    start = matched * chunk
                    matched += units
                    if matched * chunk > h0:
                        from_l1 += matched * chunk - (start if start > h0 else h0)
                    l2_last = False
                    stop1 += 1
                    continue
                in_l2 = l2_get(node_id, 0)
                if in_l2 and ttl and t - written[node_id] > ttl:
                    self.l2_used -= in_l2
                    del l2[node_id], written[node_id]
                    in_l2 = 0
                start = matched * chunk
                if in_l2 >= units:
                    matched += units
                    if via_l2 is None:
                        via_l2 = {}
                    if matched * chunk > h0:
                        from_l2 += matched * chunk - (start if start > h0 else h0)
                        via_l2[stop1] = in_l1
                    else:
                        via_l2[stop1] = -1  # refreshed in L2, not read
                    l2_last = True
                    stop1 += 1
                    continue
                # a partly held segment: its leading chunks, from L1 first
                held = in_l1 if in_l1 > in_l2 else in_l2
                matched += held
                if matched * chunk > h0:
                    l1_end = start + in_l1 * chunk
                    if l1_end > h0:
                        from_l1 += l1_end - (start if start > h0 else h0)
                    if held > in_l1:
                        from_l2 += matched * chunk - (l1_end if l1_end > h0 else h0)
                l2_last = held > in_l1
                break
            stop1 += 1
        served = matched * chunk
        if served > last:  # vLLM always recomputes the last token
            excess = served - last
            served = last
            if l2_last:
                from_l2 = from_l2 - excess if from_l2 > excess else 0
            else:
                from_l1 = from_l1 - excess if from_l1 > excess else 0
        if h0 >= served:
            from_l1 = from_l2 = 0
            cached = h0
        else:
            cached = served

        # Every tier records the request tail first (the tail is evicted first): L0 keeps the
        # prompt and the output; L1 keeps what it held, what was read from L2 and what LMCache
        # stored; L2 refreshes what was read from it and stores what LMCache did not find.
        used0 = self.l0_used[replica]
        for node_id, _end, units, _chunks in reversed(path[stop0:] + output):
            if units:
                before = l0_get(node_id)
                if before is None:
                    l0[node_id] = units
                    used0 += units
                else:
                    l0_move(node_id)
                    if before < units:
                        l0[node_id] = units
                        used0 += units - before
        for node_id, _end, units, _chunks in reversed(path[:stop0]):
            if units:
                l0_move(node_id)  # fully held: refresh
        used1 = self.l1_used[replica]
        used2 = self.l2_used
        index = len(path) - 1
        for node_id, _end, _blocks, chunks in reversed(path):
            if chunks:
                if index < stop1:
                    if via_l2 is not None and index in via_l2:
                        l2_move(node_id)
                        before = via_l2[index]
                        if before >= 0:
                            l1[node_id] = chunks
                            l1_move(node_id)
                            used1 += chunks - before
                    else:
                        l1_move(node_id)
                else:
                    before = l1_get(node_id)
                    l1[node_id] = chunks
                    if before is None:
                        used1 += chunks
                    else:
                        l1_move(node_id)
                        used1 += chunks - before
                    before = l2_get(node_id)
                    if before is None:
                        l2[node_id] = chunks
                        written[node_id] = t
                        used2 += chunks
                        self.l2_chunks_written += chunks
                    else:
                        if before < chunks or (ttl and t - written[node_id] > ttl):
                            l2[node_id] = chunks
                            written[node_id] = t
                            used2 += chunks - before
                            self.l2_chunks_written += chunks - before
                        l2_move(node_id)
            index -= 1
        self.l0_used[replica] = _evict(l0, used0, cap0, None) if used0 > cap0 else used0
        self.l1_used[replica] = _evict(l1, used1, cap1, None) if used1 > cap1 else used1
        self.l2_used = _evict(l2, used2, cap2, written) if used2 > cap2 else used2

        # Accounting and TTFT.
        overhead, per_token, per_pair, floor, l1_cost, l2_cost, l2_latency = self._timing
        new = prompt - cached
        prefill = per_token * new + per_pair * (prompt * prompt - cached * cached)
        if prefill < floor:
            prefill = floor
        service = prefill + l1_cost * from_l1
        if from_l2:
            service += l2_latency + l2_cost * from_l2
        t_ms = t * 1000
        begin = self.busy_until[replica]
        if begin < t_ms:
            begin = t_ms
        self.busy_until[replica] = begin + service
        self.busy_ms[replica] += service
        ttft = begin - t_ms + overhead + service
        self.ttft_sum += ttft
        if ttft > self.ttft_max:
            self.ttft_max = ttft
        bucket = int(math.log(ttft) * _HIST_K) if ttft > 1 else 0
        self.histogram[bucket if bucket < _HIST_BINS else _HIST_BINS - 1] += 1
        self.routed[replica] += 1
        self.tokens_l0 += h0
        self.tokens_l1 += from_l1
        self.tokens_l2 += from_l2
        self.recomputed += new
        self.last_t = t

    # --- results ------------------------------------------------------------------------------
    @property
    def requests(self) -> int:
        return sum(self.routed)

    @property
    def duration_s(self) -> float:
        """Simulated time from the first arrival to the last."""
        return self.last_t - (self.first_t or 0.0)

    @property
    def prompt_tokens(self) -> int:
        return self.tokens_l0 + self.tokens_l1 + self.tokens_l2 + self.recomputed

    def percentile(self, q: float) -> float:
        total = self.requests
        if not total:
            return 0.0
        rank = q * total
        seen = 0
        for bucket, count in enumerate(self.histogram):
            seen += count
            if seen >= rank and count:
                value = math.exp((bucket + 0.5) / _HIST_K)
                return min(value, self.ttft_max)
        return self.ttft_max

    def cdf(self) -> list[tuple[float, float]]:
        """(TTFT ms, share of requests at or below) at the edges of the non-empty bins."""
        total = self.requests
        points, seen = [], 0
        for bucket, count in enumerate(self.histogram):
            if count:
                if not points:
                    points.append((math.exp(bucket / _HIST_K), 0.0))
                seen += count
                points.append((math.exp((bucket + 1) / _HIST_K), seen / total))
        return points

    def result(self, chunk_bytes: int = 0) -> dict[str, Any]:
        """The strategy's figures; chunk_bytes (KV bytes of one chunk) gives the L2 write rate."""
        total = max(self.prompt_tokens, 1)
        duration_s = max(self.duration_s, 1e-9)
        busiest = max(self.busy_ms) if self.busy_ms else 0.0
        return {
            "strategy": self.strategy,
            "requests": self.requests,
            "promptTokens": self.prompt_tokens,
            "hitRate": {
                "l0": round(self.tokens_l0 / total, 4),
                "l1": round(self.tokens_l1 / total, 4),
                "l2": round(self.tokens_l2 / total, 4),
                "total": round((self.tokens_l0 + self.tokens_l1 + self.tokens_l2) / total, 4),
            },
            "tokens": {
                "l0": self.tokens_l0,
                "l1": self.tokens_l1,
                "l2": self.tokens_l2,
                "recomputed": self.recomputed,
            },
            "recomputedTokens": self.recomputed,
            "ttftMs": {
                "mean": round(self.ttft_sum / max(self.requests, 1), 2),
                "p50": round(self.percentile(0.50), 2),
                "p90": round(self.percentile(0.90), 2),
                "p99": round(self.percentile(0.99), 2),
                "max": round(self.ttft_max, 2),
            },
            "replicaRequests": list(self.routed),
            "busiestReplicaUtilization": round(busiest / (duration_s * 1000), 4),
            "l2WriteGBps": round(self.l2_chunks_written * chunk_bytes / duration_s / 1e9, 4),
            "l2ChunksWritten": self.l2_chunks_written,
        }


def _evict(
    cache: OrderedDict[int, int], used: int, capacity: int, written: dict[int, float] | None
) -> int:
    """LRU eviction; a partly evicted segment keeps its leading units."""
    while used > capacity:
        node_id, units = cache.popitem(last=False)
        excess = used - capacity
        if units > excess:
            cache[node_id] = units - excess
            cache.move_to_end(node_id, last=False)
            return capacity
        used -= units
        if written is not None:
            del written[node_id]
    return used


def run(
    requests: Iterable[Request],
    clusters: Sequence[Cluster],
    *,
    progress: Callable[[int], None] | None = None,
    every: int = 20000,
) -> int:
    """Feed every request to every cluster (one pass over the stream); returns the count."""
    steps = [c.step for c in clusters]
    count = 0
    for request in requests:
        if not count:
            for cluster in clusters:
                cluster.first_t = request[0]
        for step in steps:
            step(*request)
        count += 1
        if progress is not None and count % every == 0:
            progress(every)
    return count
