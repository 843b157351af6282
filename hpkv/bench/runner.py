#!/usr/bin/env python3
"""hpkv bench runner: the load and measurement engine of ``hpkv bench``.

This one file is the whole client. It uses the Python standard library only, so hpkv ships it in a
ConfigMap and runs it with the endpoint's own serving image (which has Python) as a Kubernetes Job;
``hpkv bench run --from-here`` imports the same code and runs it locally.

    python3 runner.py --spec spec.json --scenario cross-pod [--client-index I] [--format json]

It reads a spec (JSON, written by hpkv), runs one scenario against OpenAI-compatible vLLM servers
with streaming requests and prints the raw per-request timings. By default the result goes to
stdout as gzip+base64 lines between two marker lines, so hpkv can pick it out of the pod's log;
``--format json`` prints plain JSON instead. A fatal error prints one ``hpkv-bench-error:`` line
and exits 1.

Timing: TTFT runs from writing the request on an open connection to the arrival of the first
content token (the first non-empty ``text`` or ``delta.content``); connection setup is excluded and
connections are kept alive. Arrival is the kernel's receive time of the bytes (SO_TIMESTAMPNS on
Linux), so a client that gets the CPU late still times the token when it came. The client runs one
asyncio loop on raw sockets and does almost no work per chunk after the first token (no JSON
parsing, except when a conversation needs the answer text). Times are wall-clock seconds.

Prompt lengths are real token counts from the server's ``/tokenize`` endpoint, or, where it is
missing, calibrated with one probe request's ``usage.prompt_tokens``. Every prompt starts with a
run-unique reference so no two runs (and no two "fresh" prompts) share a cached prefix.

``HPKV_BENCH_RESOLVE`` (a JSON object, like curl's ``--resolve``) maps ``host:port`` to another
``host:port``; it stands in for cluster DNS when the runner is driven outside a cluster.

Python 3.8+ (serving images vary); keep this file free of third-party imports.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import gc
import gzip
import hashlib
import json
import os
import random
import re
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from urllib.parse import urlsplit

RUNNER_VERSION = 1
RESULT_BEGIN = "----- hpkv-bench-result begin -----"
RESULT_END = "----- hpkv-bench-result end -----"
ERROR_PREFIX = "hpkv-bench-error: "
RESOLVE_ENV = "HPKV_BENCH_RESOLVE"
SCENARIOS = ("cross-pod", "shared-prefix", "multi-turn")

perf_counter = time.perf_counter
# Before Python 3.11 asyncio's timeout error is not the builtin TimeoutError.
AsyncTimeout = asyncio.TimeoutError


class BenchError(Exception):
    """A fatal error: the scenario cannot run (printed as one line)."""


# Where progress lines go; hpkv replaces it with its reporter when it runs the engine in-process.
log_sink = None


def log(message: str) -> None:
    if log_sink is not None:
        log_sink(message)
        return
    sys.stderr.write("[hpkv-bench] " + message + "\n")
    sys.stderr.flush()


# ------------------------------------------------------------------------------------------------
# Prometheus text format and the vLLM / LMCache metrics the bench reads
# ------------------------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')

# snapshot key -> metric (counters: vLLM and LMCache export them with a ``_total`` suffix)
COUNTERS = {
    "l0Queries": "vllm:prefix_cache_queries",
    "l0Hits": "vllm:prefix_cache_hits",
    "externalQueries": "vllm:external_prefix_cache_queries",
    "externalHits": "vllm:external_prefix_cache_hits",
    "promptTokens": "vllm:prompt_tokens",
    "generationTokens": "vllm:generation_tokens",
    "lmcacheRequestedTokens": "lmcache:num_requested_tokens",
    "lmcacheHitTokens": "lmcache:num_hit_tokens",
    "lmcacheStoredTokens": "lmcache:num_stored_tokens",
    "l2ReadRequests": "lmcache:num_remote_read_requests",
    "l2ReadBytes": "lmcache:num_remote_read_bytes",
    "l2WriteRequests": "lmcache:num_remote_write_requests",
    "l2WriteBytes": "lmcache:num_remote_write_bytes",
}
# snapshot key prefix -> histogram (``<prefix>SumS`` and ``<prefix>Count``)
HISTOGRAMS = {
    "retrieve": "lmcache:time_to_retrieve",
    "store": "lmcache:time_to_store",
    "serverTtft": "vllm:time_to_first_token_seconds",
}


def parse_prometheus(text: str) -> dict:
    """Prometheus text exposition -> {sample name: [(labels dict, value), ...]}."""
    samples: dict = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        name, raw_labels, raw_value = match.groups()
        try:
            value = float(raw_value)
        except ValueError:
            continue
        labels = {}
        if raw_labels:
            for key, val in _LABEL.findall(raw_labels[1:-1]):
                labels[key] = val.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
        samples.setdefault(name, []).append((labels, value))
    return samples


def _total(samples: dict, name: str):
    """Sum of a metric over all its label sets (engines, TP workers); None if not exported."""
    for candidate in (name + "_total", name):
        rows = samples.get(candidate)
        if rows:
            return sum(value for _labels, value in rows)
    return None


def snapshot(samples: dict) -> dict:
    """The counters and histogram sums the bench uses; absent metrics are left out."""
    snap = {}
    for key, metric in COUNTERS.items():
        value = _total(samples, metric)
        if value is not None:
            snap[key] = value
    for key, metric in HISTOGRAMS.items():
        total = _total(samples, metric + "_sum")
        count = _total(samples, metric + "_count")
        if total is not None and count is not None:
            snap[key + "SumS"] = total
            snap[key + "Count"] = count
    return snap


def delta(before: dict, after: dict) -> dict:
    """after - before for every key present in both (a counter reset gives the 'after' value)."""
    out = {}
    for key, value in after.items():
        if key in before:
            diff = value - before[key]
            out[key] = diff if diff >= 0 else value
    return out


def _rate(hits, queries):
    if hits is None or queries is None:
        return None
    return hits / queries if queries > 0 else None


def tier_stats(d: dict) -> dict:
    """Per-tier figures from a metrics delta.

    L0 = vLLM's GPU prefix cache (``prefix_cache_hits/queries``); L1+L2 = what vLLM got from the KV
    connector, i.e. LMCache (``external_prefix_cache_hits/queries``); L2 traffic =
    ``lmcache:num_remote_*_bytes``; retrieve = LMCache's ``time_to_retrieve`` histogram.
    """
    retrieve_count = d.get("retrieveCount")
    retrieve_sum = d.get("retrieveSumS")
    return {
        "l0": {
            "hits": d.get("l0Hits"),
            "queries": d.get("l0Queries"),
            "hitRate": _rate(d.get("l0Hits"), d.get("l0Queries")),
        },
        "external": {
            "hits": d.get("externalHits"),
            "queries": d.get("externalQueries"),
            "hitRate": _rate(d.get("externalHits"), d.get("externalQueries")),
        },
        "l2": {
            "readBytes": d.get("l2ReadBytes"),
            "readRequests": d.get("l2ReadRequests"),
            "writeBytes": d.get("l2WriteBytes"),
            "writeRequests": d.get("l2WriteRequests"),
        },
        "retrieve": {
            "count": retrieve_count,
            "meanMs": (retrieve_sum / retrieve_count * 1000.0)
            if retrieve_count and retrieve_sum is not None
            else None,
        },
        "promptTokens": d.get("promptTokens"),
    }


# ------------------------------------------------------------------------------------------------
# HTTP/1.1 on asyncio streams
# ------------------------------------------------------------------------------------------------


class Target:
    """A server base URL, e.g. http://10.1.2.3:8000 or http://svc.ns.svc:443/prefix."""

    __slots__ = ("host", "hostport", "name", "path", "port", "tls", "url")

    def __init__(self, url: str, name: str = "") -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BenchError(f"not an http(s) URL: {url!r}")
        self.url = url.rstrip("/")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.path = parts.path.rstrip("/")
        self.hostport = f"{self.host}:{self.port}"
        self.name = name or self.hostport


class ChunkedDecoder:
    """Incremental decoder for ``Transfer-Encoding: chunked``."""

    __slots__ = ("buf", "done", "remaining", "state")

    def __init__(self) -> None:
        self.buf = b""
        self.remaining = 0
        self.state = 0  # 0 size line, 1 data, 2 CRLF after data, 3 trailers
        self.done = False

    def feed(self, data: bytes) -> bytes:
        buf = self.buf + data if self.buf else data
        out = []
        pos, end = 0, len(buf)
        while pos < end and not self.done:
            if self.state == 1:
                take = min(self.remaining, end - pos)
                out.append(buf[pos : pos + take])
                pos += take
                self.remaining -= take
                if self.remaining == 0:
                    self.state = 2
            elif self.state == 0:
                nl = buf.find(b"\r\n", pos)
                if nl < 0:
                    break
                size = int(buf[pos:nl].split(b";", 1)[0].strip() or b"0", 16)
                pos = nl + 2
                if size:
                    self.remaining, self.state = size, 1
                else:
                    self.state = 3
            elif self.state == 2:
                if end - pos < 2:
                    break
                pos += 2
                self.state = 0
            else:
                nl = buf.find(b"\r\n", pos)
                if nl < 0:
                    break
                self.done = nl == pos
                pos = nl + 2
        self.buf = buf[pos:]
        return b"".join(out) if len(out) != 1 else out[0]


class HttpError(Exception):
    pass


def _load_resolve() -> dict:
    raw = os.environ.get(RESOLVE_ENV)
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        raise BenchError(f"{RESOLVE_ENV} is not a JSON object") from None
    return {str(k): str(v) for k, v in data.items()}


# Linux gives each TCP read the time its bytes reached the socket (SO_TIMESTAMPNS, wall clock).
_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35) if sys.platform.startswith("linux") else 0
_ANCILLARY = socket.CMSG_SPACE(16) if _TIMESTAMPNS and hasattr(socket, "CMSG_SPACE") else 0


def _kernel_time(ancdata) -> float:
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == _TIMESTAMPNS and len(data) >= 16:
            sec, nsec = struct.unpack("qq", data[:16])
            return sec + nsec * 1e-9
    return time.time()


def _resolve_future(future) -> None:
    if not future.done():
        future.set_result(None)


class Conn:
    """One plain-TCP connection, read straight through the event loop.

    Each read returns its bytes with the kernel's receive time (wall clock), so a first token is
    timed when it arrived even if this process got the CPU later (a busy client pod, 256 streams
    on two cores). Where the kernel stamps nothing, the read's own time is used.
    """

    __slots__ = ("fd", "last_at", "loop", "pending", "pending_at", "since", "sock", "stamped")

    def __init__(self, loop, sock) -> None:
        self.loop = loop
        self.sock = sock
        self.fd = sock.fileno()
        self.pending = b""
        self.pending_at = 0.0
        self.last_at = 0.0  # receive time of the latest bytes read
        self.since = perf_counter()
        self.stamped = False
        if _ANCILLARY:
            try:
                sock.setsockopt(socket.SOL_SOCKET, _TIMESTAMPNS, 1)
                self.stamped = True
            except OSError:
                pass

    @classmethod
    async def open(cls, host: str, port: int, timeout: float):
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        if not infos:
            raise OSError(f"cannot resolve {host}")
        family, kind, proto, _name, address = infos[0]
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await asyncio.wait_for(loop.sock_connect(sock, address), timeout)
        except BaseException:
            sock.close()
            raise
        return cls(loop, sock)

    def usable(self) -> bool:
        """Still open with nothing unread (an idle keep-alive connection the server kept)."""
        if self.pending:
            return False
        try:
            return self.sock.recv(1, socket.MSG_PEEK) != b""  # b"": closed; data: out of step
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False

    async def _readable(self) -> None:
        future = self.loop.create_future()
        self.loop.add_reader(self.fd, _resolve_future, future)
        try:
            await future
        finally:
            self.loop.remove_reader(self.fd)

    async def read(self, size: int = 65536) -> tuple:
        """(bytes, receive time); b"" at end of stream."""
        if self.pending:
            data, self.pending = self.pending, b""
            self.last_at = self.pending_at
            return data, self.pending_at
        while True:
            try:
                if self.stamped:
                    data, ancdata, _flags, _address = self.sock.recvmsg(size, _ANCILLARY)
                    self.last_at = _kernel_time(ancdata)
                else:
                    data, self.last_at = self.sock.recv(size), time.time()
                return data, self.last_at
            except (BlockingIOError, InterruptedError):
                await self._readable()

    async def readuntil(self, separator: bytes) -> bytes:
        buffer = b""
        while True:
            data, when = await self.read()
            if not data:
                raise asyncio.IncompleteReadError(buffer, None)
            buffer += data
            cut = buffer.find(separator)
            if cut >= 0:
                cut += len(separator)
                self.pending, self.pending_at = buffer[cut:], when
                return buffer[:cut]

    async def readexactly(self, count: int) -> bytes:
        buffer = b""
        while len(buffer) < count:
            data, when = await self.read(count - len(buffer))
            if not data:
                raise asyncio.IncompleteReadError(buffer, count)
            buffer += data
        self.pending, self.pending_at = buffer[count:], when
        return buffer[:count]

    async def readall(self) -> bytes:
        parts = []
        while True:
            data, _when = await self.read()
            if not data:
                return b"".join(parts)
            parts.append(data)

    async def write(self, data: bytes) -> None:
        try:
            sent = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        if sent < len(data):
            await self.loop.sock_sendall(self.sock, data[sent:])

    def close(self) -> None:
        self.sock.close()


class StreamConn:
    """The same interface over asyncio streams, for https targets (reads stamped on arrival in
    this process: TLS hides the kernel's times)."""

    __slots__ = ("reader", "since", "writer")

    def __init__(self, reader, writer) -> None:
        self.reader, self.writer = reader, writer
        self.since = perf_counter()

    @classmethod
    async def open(cls, host: str, port: int, timeout: float, context, server_hostname: str):
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(
                host, port, ssl=context, server_hostname=server_hostname, limit=1 << 22
            ),
            timeout,
        )
        return cls(reader, writer)

    def usable(self) -> bool:
        return not self.writer.is_closing() and not self.reader.at_eof()

    async def read(self, size: int = 65536) -> tuple:
        data = await self.reader.read(size)
        return data, time.time()

    async def readuntil(self, separator: bytes) -> bytes:
        return await self.reader.readuntil(separator)

    async def readexactly(self, count: int) -> bytes:
        return await self.reader.readexactly(count)

    async def readall(self) -> bytes:
        return await self.reader.read()

    async def write(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    def close(self) -> None:
        self.writer.close()


class Http:
    """A keep-alive connection pool and the requests the bench makes."""

    IDLE_MAX_S = 4.0  # uvicorn closes idle keep-alive connections after 5 s

    def __init__(self, connect_timeout: float = 10.0, read_timeout: float = 600.0) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.resolve = _load_resolve()
        self._idle: dict = {}
        self._ssl = None

    async def _open(self, target: Target):
        host, port = target.host, target.port
        mapped = self.resolve.get(target.hostport)
        if mapped:
            host, _, port_text = mapped.rpartition(":")
            port = int(port_text)
        try:
            if target.tls:
                if self._ssl is None:
                    self._ssl = ssl.create_default_context()
                return await StreamConn.open(
                    host, port, self.connect_timeout, self._ssl, target.host
                )
            return await Conn.open(host, port, self.connect_timeout)
        except AsyncTimeout:
            raise HttpError(f"connect to {target.url} timed out") from None
        except OSError as exc:
            raise HttpError(f"cannot connect to {target.url}: {exc}") from None

    async def acquire(self, target: Target):
        """(connection, reused?)"""
        idle = self._idle.get(target.hostport)
        now = perf_counter()
        while idle:
            conn = idle.pop()
            if now - conn.since < self.IDLE_MAX_S and conn.usable():
                return conn, True
            conn.close()
        return await self._open(target), False

    def release(self, target: Target, conn, reusable: bool) -> None:
        if reusable:
            conn.since = perf_counter()
            self._idle.setdefault(target.hostport, []).append(conn)
        else:
            conn.close()

    def close(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()

    @staticmethod
    def _head(method: str, target: Target, path: str, body: bytes, accept: str) -> bytes:
        lines = [
            f"{method} {target.path}{path} HTTP/1.1",
            "Host: " + target.hostport,
            "Accept: " + accept,
            f"User-Agent: hpkv-bench/{RUNNER_VERSION}",
        ]
        if body or method == "POST":
            lines.append("Content-Type: application/json")
            lines.append(f"Content-Length: {len(body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body

    @staticmethod
    async def _read_head(conn):
        raw = await conn.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/"):
            raise HttpError(f"malformed HTTP status line: {lines[0][:80]!r}")
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                key, _, value = line.partition(":")
                headers[key.strip().lower()] = value.strip()
        keep = headers.get("connection", "").lower() != "close" and parts[0] != "HTTP/1.0"
        return int(parts[1]), headers, keep

    @staticmethod
    async def _read_body(conn, headers) -> tuple:
        """The whole body; (body, reusable)."""
        if "chunked" in headers.get("transfer-encoding", "").lower():
            decoder = ChunkedDecoder()
            parts = []
            while not decoder.done:
                data, _when = await conn.read()
                if not data:
                    raise HttpError("connection closed in the middle of a chunked body")
                parts.append(decoder.feed(data))
            return b"".join(parts), True
        if "content-length" in headers:
            return await conn.readexactly(int(headers["content-length"])), True
        return await conn.readall(), False

    async def request(self, target: Target, method: str, path: str, payload=None) -> tuple:
        """A plain request; (status, body bytes)."""
        body = b"" if payload is None else json.dumps(payload).encode()
        accept = "application/json, text/plain;q=0.9, */*;q=0.5"
        for attempt in (0, 1):
            conn, reused = await self.acquire(target)
            try:
                await conn.write(self._head(method, target, path, body, accept))
                status, headers, keep = await asyncio.wait_for(
                    self._read_head(conn), self.read_timeout
                )
                data, framed = await asyncio.wait_for(
                    self._read_body(conn, headers), self.read_timeout
                )
            except (ConnectionError, asyncio.IncompleteReadError) as exc:
                conn.close()
                if reused and attempt == 0:
                    continue  # the server closed an idle keep-alive connection: retry once
                raise HttpError(f"{method} {target.url}{path}: {exc}") from None
            except AsyncTimeout:
                conn.close()
                raise HttpError(f"{method} {target.url}{path} timed out") from None
            except BaseException:
                conn.close()
                raise
            self.release(target, conn, keep and framed)
            return status, data
        raise HttpError(f"{method} {target.url}{path} failed")

    async def json(self, target: Target, method: str, path: str, payload=None):
        status, data = await self.request(target, method, path, payload)
        if status != 200:
            raise HttpError(
                f"{method} {target.url}{path} returned HTTP {status}: "
                + data[:200].decode("utf-8", "replace")
            )
        try:
            return json.loads(data)
        except ValueError:
            raise HttpError(f"{method} {target.url}{path} did not return JSON") from None

    async def metrics(self, target: Target):
        """A metrics snapshot of one vLLM server, or None when /metrics is unavailable."""
        try:
            status, data = await self.request(target, "GET", "/metrics")
        except HttpError:
            return None
        if status != 200:
            return None
        return snapshot(parse_prometheus(data.decode("utf-8", "replace")))

    async def stream(
        self, target: Target, path: str, body: bytes, chat: bool, collect: bool = False
    ) -> dict:
        """One streaming completion; the timing record (never raises for HTTP/stream errors)."""
        head = self._head("POST", target, path, body, "text/event-stream")
        for attempt in (0, 1):
            try:
                conn, reused = await self.acquire(target)
            except HttpError as exc:
                return {"ok": False, "status": None, "error": str(exc)}
            t0 = time.time()
            try:
                await conn.write(head)
                status, headers, keep = await asyncio.wait_for(
                    self._read_head(conn), self.read_timeout
                )
            except (ConnectionError, asyncio.IncompleteReadError) as exc:
                conn.close()
                if reused and attempt == 0:
                    continue
                return {"ok": False, "status": None, "error": f"connection failed: {exc}"}
            except AsyncTimeout:
                conn.close()
                return {"ok": False, "status": None, "error": "no response (timed out)"}
            except BaseException:
                conn.close()
                raise
            try:
                record = await asyncio.wait_for(
                    self._consume(conn, headers, status, t0, chat, collect), self.read_timeout
                )
            except AsyncTimeout:
                conn.close()
                return {"ok": False, "status": status, "error": "stream timed out"}
            except (ConnectionError, asyncio.IncompleteReadError, HttpError) as exc:
                conn.close()
                return {"ok": False, "status": status, "error": f"stream broken: {exc}"}
            except BaseException:
                conn.close()
                raise
            self.release(target, conn, keep and record.pop("_framed"))
            return record
        return {"ok": False, "status": None, "error": "connection failed twice"}

    async def _consume(self, conn, headers, status, t0, chat, collect) -> dict:
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        decoder = ChunkedDecoder() if chunked else None
        left = int(headers["content-length"]) if "content-length" in headers and not chunked else -1
        sse = b""
        first = None
        rid = None
        usage = None
        events = 0
        texts = [] if collect else None
        error = None
        done_t = None
        while True:
            data, now = await conn.read()
            if not data:
                if chunked or left > 0:
                    raise HttpError("connection closed before the response ended")
                framed, body_done = False, True
            else:
                if decoder is not None:
                    piece = decoder.feed(data)
                    body_done = decoder.done
                elif left >= 0:
                    piece = data
                    left -= len(data)
                    body_done = left <= 0
                else:
                    piece, body_done = data, False
                framed = True
                if first is None or collect or status != 200:
                    sse += piece
                    while True:
                        cut = sse.find(b"\n\n")
                        if cut < 0:
                            break
                        event, sse = sse[:cut], sse[cut + 2 :]
                        parsed = _parse_event(event, chat)
                        if parsed is None:
                            continue
                        if parsed is _DONE:
                            done_t = done_t or now
                            continue
                        events += 1
                        obj, text = parsed
                        if rid is None:
                            rid = obj.get("id")
                        if obj.get("error") is not None and error is None:
                            error = _error_text(obj["error"])
                        if obj.get("usage"):
                            usage = obj["usage"]
                        if text:
                            if first is None:
                                first = now
                            if texts is not None:
                                texts.append(text)
                            elif status == 200:
                                # The rest of this read goes the cheap way below.
                                events += sse.count(b"data: ")
                                if b"data: [DONE]" in sse:
                                    done_t = now
                                break
                else:
                    # After the first token only the end and the usage event matter.
                    events += piece.count(b"data: ")
                    sse = (sse + piece)[-16384:]
                    if done_t is None and b"data: [DONE]" in piece:
                        done_t = now
            if body_done:
                break
        end = done_t or now
        if first is not None and not collect and sse:
            for event in reversed(sse.split(b"\n\n")):
                parsed = _parse_event(event, chat)
                if parsed is not None and parsed is not _DONE and parsed[0].get("usage"):
                    usage = parsed[0]["usage"]
                    break
        record = {
            "_framed": framed,
            "status": status,
            "id": rid,
            "ok": status == 200 and error is None and first is not None,
            "error": error,
            "t0": t0,
            "ttftMs": (first - t0) * 1000.0 if first is not None else None,
            "e2eMs": (end - t0) * 1000.0,
        }
        if status != 200:
            record["error"] = f"HTTP {status}: {sse[:200].decode('utf-8', 'replace')}"
        elif first is None and error is None:
            record["error"] = "no content token in the stream"
        if usage:
            record["promptTokens"] = usage.get("prompt_tokens")
            record["outputTokens"] = usage.get("completion_tokens")
            details = usage.get("prompt_tokens_details") or {}
            record["cachedTokens"] = details.get("cached_tokens")
        else:
            record["outputTokens"] = max(0, events - 1) if first is not None else 0
        if texts is not None:
            record["text"] = "".join(texts)
        return record


_DONE = object()


def _error_text(err) -> str:
    if isinstance(err, dict):
        return str(err.get("message") or err)[:300]
    return str(err)[:300]


def _parse_event(event: bytes, chat: bool):
    """One SSE event -> _DONE, (object, content text) or None."""
    payload = None
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            payload = line[5:].strip()
    if payload is None:
        return None
    if payload == b"[DONE]":
        return _DONE
    try:
        obj = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    text = None
    choices = obj.get("choices")
    if choices:
        choice = choices[0]
        if chat:
            delta_ = choice.get("delta") or {}
            text = delta_.get("content") or delta_.get("reasoning_content")
        else:
            text = choice.get("text")
    return obj, text


# ------------------------------------------------------------------------------------------------
# Prompts of a given length in real tokens
# ------------------------------------------------------------------------------------------------

VOCAB = (  # noqa: SIM905 - a word list reads better as text
    "time year people way day man thing woman life child world school state family student "
    "group country problem hand part place case week company system program question work "
    "government number night point home water room mother area money story fact month lot "
    "right study book eye job word business issue side kind head house service friend father "
    "power hour game line end member law car city community name president team minute idea "
    "kid body information back parent face others level office door health person art war "
    "history party result change morning reason research girl guy moment air teacher force "
    "education foot boy age policy music market sense nation plan college interest death "
    "experience effect use class control care field development role effort rate heart drug "
    "show leader light voice wife police mind price report decision son view relationship "
    "town road arm difference value building action model season society tax director "
    "position player record paper space ground form event official matter center couple site "
    "project activity star table need court oil situation cost industry figure street image "
    "phone data picture practice piece land product doctor wall patient worker news test movie "
    "north love support technology step baby computer type attention film tree source truth "
    "river garden cloud stone paper bridge window summer winter letter number"
).split()


def _digest(*parts) -> str:
    return hashlib.sha256("/".join(str(p) for p in parts).encode()).hexdigest()


class Prompts:
    """Builds prompt texts of a target token count using the server's tokenizer."""

    def __init__(self, http: Http, target: Target, api: str, model, salt: str) -> None:
        self.http = http
        self.target = target
        self.chat = api == "chat"
        self.model = model
        self.salt = salt
        self.method = "tokenize"  # or "usage" once /tokenize proved unavailable
        self._tokens_per_word = None

    def nonce(self, key: str) -> str:
        return f"ref {_digest(self.salt, key)[:12]}."

    def words(self, key: str, count: int) -> str:
        rng = random.Random(_digest(self.salt, "words", key))
        return " ".join(rng.choice(VOCAB) for _ in range(max(0, count)))

    def text(self, key: str, words: int) -> str:
        return self.nonce(key) + " " + self.words(key, words)

    def messages(self, text: str) -> list:
        return [{"role": "user", "content": text}]

    async def count(self, text: str):
        """Tokens of ``text`` as a whole prompt (BOS and, for chat, the template included), or None
        when the server has no /tokenize. Never sends ``text`` as a request: that would cache it."""
        if self.method != "tokenize":
            return None
        payload = {"messages": self.messages(text)} if self.chat else {"prompt": text}
        if self.model:
            payload["model"] = self.model
        try:
            result = await self.http.json(self.target, "POST", "/tokenize", payload)
            return int(result["count"]) if "count" in result else len(result["tokens"])
        except (HttpError, KeyError, TypeError, ValueError) as exc:
            log(f"/tokenize unavailable ({exc}); calibrating with usage.prompt_tokens")
            self.method = "usage"
            return None

    async def exact(self, key: str, tokens: int, head: str = "") -> tuple:
        """(text, token count or None, exact?) for a prompt of ``tokens`` tokens after ``head``."""
        words = max(1, tokens - 12)
        best = None
        for _ in range(12):
            text = head + self.text(key, words)
            count = await self.count(text)
            if count is None:
                break
            if best is None or abs(count - tokens) < abs(best[1] - tokens):
                best = (text, count)
            if count == tokens:
                return text, count, True
            step = tokens - count
            words = max(1, words + (step if abs(step) > 1 else (1 if step > 0 else -1)))
        else:
            return best[0], best[1], False
        words = await self._words_for(tokens)
        return head + self.text(key, words), None, False

    async def _words_for(self, tokens: int) -> int:
        """Words for ``tokens`` tokens from one probe request's usage (a prompt of its own)."""
        if self._tokens_per_word is None:
            path = "/v1/chat/completions" if self.chat else "/v1/completions"
            probe = self.text("calibration", 200)
            body = request_body(self.model, probe, self.chat, 1, stream=False)
            result = await self.http.json(self.target, "POST", path, body)
            try:
                count = int(result["usage"]["prompt_tokens"])
            except (KeyError, TypeError, ValueError):
                raise BenchError(
                    "the server has no /tokenize endpoint and returns no usage.prompt_tokens"
                ) from None
            self._tokens_per_word = max(0.2, count / 203.0)
        return max(1, round(tokens / self._tokens_per_word) - 4)

    async def words_for_suffix(self, prefix: str, tokens: int, sample_key: str) -> int:
        """Words a suffix needs to add about ``tokens`` tokens after ``prefix``."""
        base = await self.count(prefix)
        words = max(1, tokens - 4)
        for _ in range(8):
            total = await self.count(prefix + "\n" + self.text(sample_key, words))
            if base is None or total is None:
                return await self._words_for(tokens)
            if total - base == tokens:
                break
            words = max(1, words + (tokens - (total - base)))
        return words


def request_body(model, prompt, chat: bool, max_tokens: int, stream: bool = True, **extra) -> dict:
    body = {"max_tokens": max_tokens, "temperature": 0.0}
    if model:
        body["model"] = model
    if chat:
        body["messages"] = (
            prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        )
    else:
        body["prompt"] = prompt
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    body.update(extra)
    return body


# ------------------------------------------------------------------------------------------------
# Scenarios
# ------------------------------------------------------------------------------------------------


class Run:
    """What every scenario needs: the spec, the pool, targets, model and this client's share."""

    def __init__(self, spec: dict, client: int, clients: int) -> None:
        self.spec = spec
        self.client = client
        self.clients = clients
        self.api = spec.get("api", "completions")
        self.chat = self.api == "chat"
        self.path = spec.get("path") or ("/v1/chat/completions" if self.chat else "/v1/completions")
        self.http = Http(read_timeout=float(spec.get("requestTimeoutS", 600)))
        self.pods = [Target(p["url"], p.get("name", "")) for p in spec.get("pods", [])]
        router = spec.get("router") or {}
        self.router = (
            Target(router["url"], router.get("name", "router")) if router.get("url") else None
        )
        self.model = spec.get("model")
        self.salt = spec.get("runId") or _digest(time.time(), os.getpid())[:12]
        self.t0 = time.time()
        self.notes = []

    @property
    def any_target(self) -> Target:
        if self.pods:
            return self.pods[0]
        if self.router:
            return self.router
        raise BenchError("the spec names no pod and no router URL")

    async def discover_model(self) -> None:
        if self.model:
            return
        target = self.any_target
        try:
            data = await self.http.json(target, "GET", "/v1/models")
            self.model = data["data"][0]["id"]
        except (HttpError, KeyError, IndexError, TypeError) as exc:
            raise BenchError(
                f"cannot read the served model from {target.url}/v1/models: {exc}"
            ) from None

    def prompts(self) -> Prompts:
        return Prompts(self.http, self.any_target, self.api, self.model, self.salt)

    def body(self, prompt, max_tokens: int) -> bytes:
        extra = self.spec.get("extraBody") or {}
        return json.dumps(request_body(self.model, prompt, self.chat, max_tokens, **extra)).encode()

    async def send(self, target: Target, body: bytes, collect: bool = False, **meta) -> dict:
        record = await self.http.stream(target, self.path, body, self.chat, collect)
        t0 = record.pop("t0", None)
        record["startS"] = (t0 - self.t0) if t0 is not None else (time.time() - self.t0)
        record["target"] = target.name
        record["client"] = self.client
        record.update(meta)
        return record

    def load_targets(self, via: str) -> list:
        if via == "pods" or self.router is None:
            if not self.pods:
                raise BenchError("no router URL and no pod URLs to send load to")
            if via != "pods":
                self.notes.append("no routing service: load went round-robin to the pods directly")
            return self.pods
        return [self.router]


async def scenario_cross_pod(run: Run) -> dict:
    """Pod A computes a fresh prompt, pod B gets the identical prompt (warm) and another fresh
    prompt of the same length (cold). Pod metrics around each request give per-request hits,
    L2 bytes and LMCache retrieve time."""
    p = run.spec.get("crossPod") or {}
    if len(run.pods) < 2:
        raise BenchError(
            f"cross-pod needs two pod URLs (pod A and pod B); the spec has {len(run.pods)}"
        )
    pod_a = run.pods[int(p.get("podA", 0))]
    pod_b = run.pods[int(p.get("podB", 1))]
    lengths = [int(x) for x in p.get("lengths", [500, 1000, 1500, 2000, 2500, 3000])]
    reps = int(p.get("repetitions", 3))
    max_tokens = int(p.get("maxTokens", 5))
    settle_timeout = float(p.get("settleTimeoutS", 5.0))
    settle_min = float(p.get("settleMinS", 0.2))
    await run.discover_model()
    prompts = run.prompts()
    requests = []
    writes_seen = None  # unknown until the first seed request
    for length in lengths:
        for rep in range(reps):
            shared, shared_n, exact = await prompts.exact(f"xp/{length}/{rep}/shared", length)
            cold, cold_n, _ = await prompts.exact(f"xp/{length}/{rep}/cold", length)
            common = {"length": length, "rep": rep}
            a0 = await run.http.metrics(pod_a)
            seed = await run.send(
                pod_a, run.body(shared, max_tokens), role="seed", targetTokens=shared_n, **common
            )
            settle = await _settle(
                run, pod_a, a0, settle_timeout if writes_seen is not False else 0.0, settle_min
            )
            seed.update(settle)
            if writes_seen is None or writes_seen is False:
                writes_seen = bool(settle.get("l2WriteBytes"))
            warm = await _measured(
                run,
                pod_b,
                run.body(shared, max_tokens),
                role="warm",
                targetTokens=shared_n,
                **common,
            )
            cold_rec = await _measured(
                run, pod_b, run.body(cold, max_tokens), role="cold", targetTokens=cold_n, **common
            )
            requests += [seed, warm, cold_rec]
            log(
                f"cross-pod {length} tokens rep {rep + 1}/{reps}: "
                f"cold {_fmt(cold_rec.get('ttftMs'))} ms, warm {_fmt(warm.get('ttftMs'))} ms, "
                f"hit tokens {warm.get('hitTokens')}"
            )
            if not exact and shared_n is not None:
                run.notes.append(f"prompt for {length} tokens came out at {shared_n} tokens")
    if writes_seen is False:
        run.notes.append(
            "pod A reported no L2 writes (lmcache:num_remote_write_bytes did not grow)"
        )
    return {
        "parameters": {
            "lengths": lengths,
            "repetitions": reps,
            "maxTokens": max_tokens,
            "temperature": 0.0,
            "podA": pod_a.name,
            "podB": pod_b.name,
            "settleTimeoutS": settle_timeout,
            "tokenCounts": prompts.method,
        },
        "requests": requests,
    }


async def _settle(run: Run, pod: Target, before, timeout: float, minimum: float) -> dict:
    """Wait until pod A's L2 writes for the seed request have landed (or the timeout)."""
    start = perf_counter()
    if before is None or "l2WriteBytes" not in before:
        await asyncio.sleep(minimum)
        return {"settleMs": (perf_counter() - start) * 1000.0}
    last, stable = None, 0
    snap = before
    while True:
        snap = await run.http.metrics(pod) or snap
        written = snap.get("l2WriteBytes", 0.0) - before["l2WriteBytes"]
        if written > 0 and written == last:
            stable += 1
            if stable >= 1:
                break
        else:
            stable = 0
        last = written
        if perf_counter() - start >= max(timeout, minimum):
            break
        await asyncio.sleep(0.05)
    elapsed = perf_counter() - start
    if elapsed < minimum:
        await asyncio.sleep(minimum - elapsed)
    d = delta(before, snap)
    return {
        "settleMs": (perf_counter() - start) * 1000.0,
        "l2WriteBytes": d.get("l2WriteBytes"),
        "l2WriteRequests": d.get("l2WriteRequests"),
    }


async def _measured(run: Run, pod: Target, body: bytes, **meta) -> dict:
    before = await run.http.metrics(pod)
    record = await run.send(pod, body, **meta)
    after = await run.http.metrics(pod) if before is not None else None
    if before is None or after is None:
        return record
    d = delta(before, after)
    stats = tier_stats(d)
    record["hitTokens"] = d.get("externalHits")
    record["l0HitTokens"] = d.get("l0Hits")
    record["lmcacheHitTokens"] = d.get("lmcacheHitTokens")
    record["l2ReadBytes"] = d.get("l2ReadBytes")
    record["l2ReadRequests"] = d.get("l2ReadRequests")
    record["l2ReadMs"] = stats["retrieve"]["meanMs"]
    if record["l2ReadMs"] is not None:
        record["l2ReadSource"] = "histogram"
    prompt_delta = d.get("promptTokens")
    if prompt_delta is not None and record.get("promptTokens") is not None:
        record["interference"] = prompt_delta != record["promptTokens"]
    return record


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def _share(total: int, client: int, clients: int) -> int:
    return total // clients + (1 if client < total % clients else 0)


@contextlib.contextmanager
def _no_gc_pauses():
    """No cyclic garbage collection while requests are in flight: a full collection of a large
    heap stalls the loop for tens of milliseconds, and first tokens would wait for it. What the
    run allocates is mostly acyclic (freed by reference counting); one collection follows."""
    enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()
        gc.collect()


async def _prewarm(run: Run, jobs: list, count: int) -> None:
    """Open the connections the load will use before it starts, so a burst of connects does not
    land in the first requests (TTFT never includes connection setup)."""
    per_target: dict = {}
    for target, _body, _meta in jobs:
        per_target[target.hostport] = target
    opened = []
    for target in per_target.values():
        wanted = min(count, sum(1 for t, _b, _m in jobs if t is target))
        results = await asyncio.gather(
            *(run.http.acquire(target) for _ in range(wanted)), return_exceptions=True
        )
        opened += [(target, r) for r in results if not isinstance(r, BaseException)]
    for target, (conn, _reused) in opened:
        run.http.release(target, conn, True)


async def _drive(run: Run, jobs: list, concurrency, rate, seed) -> list:
    """Send prepared jobs (target, body, meta) with a concurrency cap and/or Poisson arrivals."""
    records = [None] * len(jobs)
    limit = max(1, int(concurrency)) if concurrency else None

    async def one(i):
        target, body, meta = jobs[i]
        records[i] = await run.send(target, body, **meta)

    await _prewarm(run, jobs, limit or len(jobs))
    run.t0 = time.time()
    if not rate:
        limit = limit or len(jobs) or 1
        cursor = iter(range(len(jobs)))

        async def worker():
            for i in cursor:
                await one(i)

        await asyncio.gather(*(worker() for _ in range(min(limit, len(jobs)) or 1)))
        return records
    rng = random.Random(_digest(seed, "arrivals", run.client))
    gate = asyncio.Semaphore(limit) if limit else None

    async def gated(i):
        if gate is None:
            return await one(i)
        async with gate:
            await one(i)

    tasks = []
    due = perf_counter()
    for i in range(len(jobs)):
        delay = due - perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(gated(i)))
        due += rng.expovariate(rate)
    await asyncio.gather(*tasks)
    return records


async def scenario_shared_prefix(run: Run) -> dict:
    """S shared system prompts of P tokens, U users with unique suffixes of Q tokens."""
    p = run.spec.get("sharedPrefix") or {}
    if p.get("driver") == "vllm":
        return await scenario_vllm_bench(run, p)
    prefixes = int(p.get("prefixes", 4))
    prefix_tokens = int(p.get("prefixTokens", 1000))
    users = int(p.get("users", 32))
    suffix_tokens = int(p.get("suffixTokens", 100))
    total = int(p.get("requests", 128))
    max_tokens = int(p.get("maxTokens", 32))
    via = p.get("via", "router")
    concurrency = p.get("concurrency")
    rate = p.get("rate")
    await run.discover_model()
    prompts = run.prompts()
    heads = []
    prefix_counts = []
    for s in range(prefixes):
        text, count, _ = await prompts.exact(f"sp/prefix/{s}", prefix_tokens)
        heads.append(text)
        prefix_counts.append(count)
    words = await prompts.words_for_suffix(heads[0], suffix_tokens, "sp/suffix-calibration")
    order = list(range(total))
    if p.get("shuffle", True):
        random.Random(_digest(run.spec.get("seed", 0), "order")).shuffle(order)
    targets = run.load_targets(via)
    share = [i for n, i in enumerate(order) if n % run.clients == run.client]
    jobs = []
    for n, i in enumerate(share):
        user = i % users
        prefix = user % prefixes
        suffix = prompts.text(f"sp/user/{user}/{i}", words)
        if run.chat:
            prompt = [
                {"role": "system", "content": heads[prefix]},
                {"role": "user", "content": suffix},
            ]
        else:
            prompt = heads[prefix] + "\n" + suffix
        target = targets[n % len(targets)]
        jobs.append(
            (
                target,
                run.body(prompt, max_tokens),
                {"role": "load", "prefix": prefix, "user": user, "request": i},
            )
        )
    share_c = _share(int(concurrency), run.client, run.clients) if concurrency else None
    share_r = float(rate) / run.clients if rate else None
    records = await _drive(run, jobs, share_c, share_r, run.spec.get("seed", 0))
    ok = sum(1 for r in records if r.get("ok"))
    log(f"shared-prefix: {len(records)} requests, {ok} ok")
    return {
        "parameters": {
            "prefixes": prefixes,
            "prefixTokens": prefix_tokens,
            "users": users,
            "suffixTokens": suffix_tokens,
            "requests": total,
            "maxTokens": max_tokens,
            "concurrency": concurrency,
            "rate": rate,
            "via": via,
            "driver": "hpkv",
            "prefixTokenCounts": prefix_counts,
            "suffixWords": words,
            "tokenCounts": prompts.method,
        },
        "requests": records,
    }


async def scenario_multi_turn(run: Run) -> dict:
    """Concurrent sessions whose history grows turn by turn (the answers are the model's own)."""
    p = run.spec.get("multiTurn") or {}
    sessions = int(p.get("sessions", 8))
    turns = int(p.get("turns", 4))
    system_tokens = int(p.get("systemTokens", 500))
    first_tokens = int(p.get("firstTurnTokens", 500))
    turn_tokens = int(p.get("turnTokens", 200))
    max_tokens = int(p.get("maxTokens", 64))
    via = p.get("via", "router")
    concurrency = p.get("concurrency")
    think = float(p.get("thinkTimeS", 0.0))
    await run.discover_model()
    prompts = run.prompts()
    system = ""
    system_count = 0
    if system_tokens > 0:
        system, system_count, _ = await prompts.exact("mt/system", system_tokens)
    base = system or prompts.nonce("mt/base")
    first_words = await prompts.words_for_suffix(base, first_tokens, "mt/first-calibration")
    turn_words = await prompts.words_for_suffix(base, turn_tokens, "mt/turn-calibration")
    targets = run.load_targets(via)
    mine = [s for s in range(sessions) if s % run.clients == run.client]
    gate = (
        asyncio.Semaphore(_share(int(concurrency), run.client, run.clients))
        if concurrency
        else None
    )
    records = []
    run.t0 = time.time()

    async def session(s, index):
        history = []
        target = targets[index % len(targets)]
        for turn in range(turns):
            words = first_words if turn == 0 else turn_words
            history.append(("user", prompts.text(f"mt/{s}/{turn}", words)))
            prompt = _conversation(system, history, run.chat)
            record = await run.send(
                target,
                run.body(prompt, max_tokens),
                collect=True,
                role="turn",
                session=s,
                turn=turn + 1,
            )
            history.append(("assistant", record.pop("text", "")))
            records.append(record)
            if not record.get("ok"):
                break
            if think:
                await asyncio.sleep(think)

    async def gated(s, index):
        if gate is None:
            return await session(s, index)
        async with gate:
            await session(s, index)

    await asyncio.gather(*(gated(s, n) for n, s in enumerate(mine)))
    log(f"multi-turn: {len(mine)} sessions x {turns} turns, {len(records)} requests")
    return {
        "parameters": {
            "sessions": sessions,
            "turns": turns,
            "systemTokens": system_tokens,
            "systemTokenCount": system_count,
            "firstTurnTokens": first_tokens,
            "turnTokens": turn_tokens,
            "maxTokens": max_tokens,
            "via": via,
            "concurrency": concurrency,
            "thinkTimeS": think,
            "tokenCounts": prompts.method,
        },
        "requests": records,
    }


def _conversation(system: str, history: list, chat: bool):
    if chat:
        messages = [{"role": "system", "content": system}] if system else []
        return messages + [{"role": role, "content": text} for role, text in history]
    parts = [system] if system else []
    for role, text in history:
        parts.append(("User: " if role == "user" else "Assistant:") + text)
    return "\n".join(parts) + "\nAssistant:"


# ------------------------------------------------------------------------------------------------
# vllm bench serve (the serving image's own load generator) for the shared-prefix scenario
# ------------------------------------------------------------------------------------------------


def vllm_bench_argv(run: Run, p: dict, result_dir: str) -> list:
    target = run.load_targets(p.get("via", "router"))[0]
    prompts = _share(int(p.get("requests", 128)), run.client, run.clients)
    argv = [
        "vllm",
        "bench",
        "serve",
        "--backend",
        "openai-chat" if run.chat else "openai",
        "--base-url",
        target.url,
        "--endpoint",
        run.path,
        "--dataset-name",
        "prefix_repetition",
        "--prefix-repetition-prefix-len",
        str(int(p.get("prefixTokens", 1000))),
        "--prefix-repetition-suffix-len",
        str(int(p.get("suffixTokens", 100))),
        "--prefix-repetition-num-prefixes",
        str(int(p.get("prefixes", 4))),
        "--prefix-repetition-output-len",
        str(int(p.get("maxTokens", 32))),
        "--num-prompts",
        str(prompts),
        "--seed",
        str(int(run.spec.get("seed", 0)) + run.client),
        "--temperature",
        "0",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,90,99",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        result_dir,
        "--result-filename",
        "vllm-bench.json",
    ]
    if run.model:
        argv += ["--model", run.model]
    if p.get("tokenizer"):
        argv += ["--tokenizer", str(p["tokenizer"])]
    if p.get("concurrency"):
        argv += ["--max-concurrency", str(_share(int(p["concurrency"]), run.client, run.clients))]
    rate = p.get("rate")
    argv += ["--request-rate", str(float(rate) / run.clients) if rate else "inf"]
    return argv


def vllm_bench_records(saved: dict, client: int, target: str) -> list:
    """Per-request records from ``vllm bench serve --save-detailed`` JSON (times in seconds)."""
    ttfts = saved.get("ttfts")
    if ttfts is None:
        raise BenchError(
            "vllm bench serve saved no per-request 'ttfts' (was --save-detailed dropped?)"
        )
    n = len(ttfts)

    def column(name):
        values = saved.get(name)
        return values if isinstance(values, list) and len(values) == n else [None] * n

    inputs, outputs = column("input_lens"), column("output_lens")
    starts, errors, latencies = column("start_times"), column("errors"), column("latencies")
    base = min((s for s in starts if s is not None), default=None)
    records = []
    for i in range(n):
        error = errors[i] or None
        ok = not error and (outputs[i] or 0) > 0
        records.append(
            {
                "client": client,
                "target": target,
                "role": "load",
                "request": i,
                "ok": ok,
                "status": None,
                "error": error,
                "id": None,
                "startS": (starts[i] - base)
                if starts[i] is not None and base is not None
                else None,
                "ttftMs": ttfts[i] * 1000.0 if ok else None,
                "e2eMs": latencies[i] * 1000.0 if latencies[i] is not None else None,
                "promptTokens": inputs[i],
                "outputTokens": outputs[i],
                "cachedTokens": None,
            }
        )
    return records


VLLM_SUMMARY_KEYS = (
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "max_concurrency",
    "request_rate",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "p99_tpot_ms",
)


async def scenario_vllm_bench(run: Run, p: dict) -> dict:
    await run.discover_model()
    with tempfile.TemporaryDirectory(prefix="hpkv-vllm-bench-") as tmp:
        argv = vllm_bench_argv(run, p, tmp)
        log("running: " + " ".join(argv))
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        output, _ = await proc.communicate()
        tail = output.decode("utf-8", "replace")[-2000:]
        sys.stderr.write(tail + "\n")
        if proc.returncode != 0:
            last = tail.strip().splitlines()[-1] if tail.strip() else "no output"
            raise BenchError(f"vllm bench serve exited with {proc.returncode}: {last}")
        path = os.path.join(tmp, "vllm-bench.json")
        try:
            with open(path, encoding="utf-8") as handle:
                saved = json.load(handle)
        except (OSError, ValueError) as exc:
            raise BenchError(f"vllm bench serve left no readable result JSON: {exc}") from None
    target = run.load_targets(p.get("via", "router"))[0].name
    return {
        "parameters": dict(p, driver="vllm", argv=argv[3:]),
        "requests": vllm_bench_records(saved, run.client, target),
        "vllmBench": {k: saved.get(k) for k in VLLM_SUMMARY_KEYS if k in saved},
    }


# ------------------------------------------------------------------------------------------------
# Start barrier for several client pods (an Indexed Job): pod 0 coordinates
# ------------------------------------------------------------------------------------------------


async def barrier(spec: dict, scenario: str, client: int, clients: int) -> float:
    """Block until all ``clients`` runners are up; returns the seconds spent waiting."""
    if clients <= 1:
        return 0.0
    conf = (spec.get("barriers") or {}).get(scenario) or spec.get("barrier") or {}
    host, port = conf.get("host", "localhost"), int(conf.get("port", 29600))
    timeout = float(conf.get("timeoutS", 900))
    start = perf_counter()
    if client == 0:
        arrived = []
        ready = asyncio.Event()

        async def on_connect(reader, writer):
            line = await reader.readline()
            if line.startswith(b"ready"):
                arrived.append(writer)
                if len(arrived) >= clients - 1:
                    ready.set()

        server = await asyncio.start_server(on_connect, "0.0.0.0", port)
        try:
            await asyncio.wait_for(ready.wait(), timeout)
        except AsyncTimeout:
            raise BenchError(
                f"only {len(arrived) + 1} of {clients} client pods reached the start barrier "
                f"in {timeout:.0f} s"
            ) from None
        for writer in arrived:
            writer.write(b"go\n")
        await asyncio.gather(*(w.drain() for w in arrived), return_exceptions=True)
        for writer in arrived:
            writer.close()
        server.close()
        return perf_counter() - start
    mapped = _load_resolve().get(f"{host}:{port}")
    connect_host, connect_port = (
        (mapped.rpartition(":")[0], int(mapped.rpartition(":")[2])) if mapped else (host, port)
    )
    while True:
        try:
            reader, writer = await asyncio.open_connection(connect_host, connect_port)
            writer.write(b"ready %d\n" % client)
            await writer.drain()
            line = await asyncio.wait_for(
                reader.readline(), max(1.0, timeout - (perf_counter() - start))
            )
            writer.close()
            if line.strip() == b"go":
                return perf_counter() - start
        except (OSError, AsyncTimeout):
            pass
        if perf_counter() - start > timeout:
            raise BenchError(
                f"client {client}: no start signal from {host}:{port} in {timeout:.0f} s"
            )
        await asyncio.sleep(0.5)


# ------------------------------------------------------------------------------------------------
# Entry points
# ------------------------------------------------------------------------------------------------

SCENARIO_FUNCS = {
    "cross-pod": scenario_cross_pod,
    "shared-prefix": scenario_shared_prefix,
    "multi-turn": scenario_multi_turn,
}


async def run_scenario(spec: dict, scenario: str, client: int = 0, clients: int = 1) -> dict:
    """Run one scenario and return this client's result document."""
    if scenario not in SCENARIO_FUNCS:
        raise BenchError("unknown scenario {!r} (one of {})".format(scenario, ", ".join(SCENARIOS)))
    waited = await barrier(spec, scenario, client, clients)
    run = Run(spec, client, clients)
    started = time.time()
    try:
        with _no_gc_pauses():
            out = await SCENARIO_FUNCS[scenario](run)
    finally:
        run.http.close()
    finished = time.time()
    out.update(
        {
            "runner": RUNNER_VERSION,
            "python": ".".join(map(str, sys.version_info[:3])),
            "scenario": scenario,
            "client": client,
            "clients": clients,
            "model": run.model,
            "api": run.api,
            "startedAt": started,
            "finishedAt": finished,
            "barrierWaitS": waited,
            "notes": out.get("notes", []) + run.notes,
        }
    )
    return out


def encode_result(result: dict) -> str:
    """The result block a runner prints: marker, gzip+base64 lines, marker."""
    blob = base64.b64encode(gzip.compress(json.dumps(result, separators=(",", ":")).encode(), 6))
    text = blob.decode("ascii")
    lines = [text[i : i + 76] for i in range(0, len(text), 76)]
    return "\n".join([RESULT_BEGIN, *lines, RESULT_END]) + "\n"


def decode_results(log_text: str) -> list:
    """Every result block in a log (hpkv reads pod logs with this)."""
    results = []
    lines = log_text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip().endswith(RESULT_BEGIN):
            chunk = []
            i += 1
            while i < len(lines) and not lines[i].strip().endswith(RESULT_END):
                chunk.append(lines[i].strip().split(" ")[-1])
                i += 1
            if i < len(lines):
                results.append(json.loads(gzip.decompress(base64.b64decode("".join(chunk)))))
        i += 1
    return results


def find_error(log_text: str):
    """The runner's fatal error line in a log, if any."""
    for line in reversed(log_text.splitlines()):
        index = line.find(ERROR_PREFIX)
        if index >= 0:
            return line[index + len(ERROR_PREFIX) :].strip()
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="hpkv bench runner (stdlib only)")
    parser.add_argument("--spec", required=True, help="spec JSON file written by hpkv")
    parser.add_argument("--scenario", required=True, choices=SCENARIOS)
    parser.add_argument(
        "--client-index", type=int, default=None, help="default: $JOB_COMPLETION_INDEX or 0"
    )
    parser.add_argument("--clients", type=int, default=None, help="default: the spec's 'clients'")
    parser.add_argument("--format", choices=("block", "json"), default="block")
    args = parser.parse_args(argv)
    try:
        with open(args.spec, encoding="utf-8") as handle:
            spec = json.load(handle)
        client = args.client_index
        if client is None:
            client = int(os.environ.get("JOB_COMPLETION_INDEX", "0") or 0)
        clients = args.clients or int(spec.get("clients", 1))
        result = asyncio.run(run_scenario(spec, args.scenario, client, clients))
    except (BenchError, HttpError, OSError, ValueError) as exc:
        traceback.print_exc(file=sys.stderr)
        sys.stdout.write(ERROR_PREFIX + " ".join(str(exc).split()) + "\n")
        sys.stdout.flush()
        return 1
    if args.format == "json":
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        sys.stdout.write(encode_result(result))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
