"""Workloads for ``hpkv simulate``: synthetic generators and JSONL traces, streamed.

A request is ``(time_s, session, path, prompt_tokens, output)``. ``path`` is the prompt as a
chain of *segments*; each is a tuple ``(node_id, end, blocks, chunks)``: an id that stands for
the whole prefix ending with the segment (the hash chain of its blocks), the prompt position
where it ends, and the number of 16-token blocks and 256-token chunks that end inside it. A block
or chunk that straddles a segment boundary belongs to the later segment, because its hash
depends on that segment's tokens.

A segment may grow between requests as long as it is only ever appended to: a chat session's
private history (context, questions and answers) is one segment that every turn extends, and a
cache that holds its first N blocks holds exactly the first N blocks of every later version.
So a chat turn is two segments (shared system prompt, session) however long the conversation,
and the simulator's work per request does not grow with tokens or turns.

``output`` holds the segments that the model's answer completes (the session segment again,
extended by the answer: vLLM keeps generated tokens in its prefix cache and the next turn repeats
them); empty when unknown (traces).
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import math
import random
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from hpkv.errors import UsageError

Node = tuple[int, int, int, int]
Request = tuple[float, Any, tuple[Node, ...], int, tuple[Node, ...]]

WORKLOAD_KINDS = ("chat", "system-prompt", "document-qa")


@dataclass(frozen=True)
class WorkloadSpec:
    """Parameters of a synthetic workload (the presets below fill them per kind)."""

    kind: str = "chat"
    requests: int = 20000
    rate: float = 4.0  # requests per second (Poisson arrivals)
    users: int = 400  # sessions in flight; an arrival continues one of them at random
    turns: int = 8  # requests per session
    prefixes: int = 4  # distinct shared prefixes (system prompts or documents)
    prefix_tokens: int = 2048
    skew: float = 0.0  # Zipf exponent of prefix popularity (0 = uniform)
    overlap: float = 1.0  # share of sessions that use a shared prefix (others: a private one)
    context_tokens: int = 512  # private context after the prefix (user history), per session
    question_tokens: int = 128
    answer_tokens: int = 256

    def to_dict(self) -> dict[str, Any]:
        return {_camel(k): v for k, v in asdict(self).items()}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.capitalize() for p in rest)


PRESETS: dict[str, WorkloadSpec] = {
    # Shared system prompts + per-user history + multi-turn chat (LMCache multi-round QA shape).
    "chat": WorkloadSpec(),
    # Single-turn requests: one of a few popular system prompts + a fresh question.
    "system-prompt": WorkloadSpec(
        kind="system-prompt",
        rate=8.0,
        users=1,
        turns=1,
        prefixes=16,
        prefix_tokens=1536,
        skew=1.0,
        context_tokens=0,
        question_tokens=256,
        answer_tokens=128,
    ),
    # Long documents with follow-up questions about the same document.
    "document-qa": WorkloadSpec(
        kind="document-qa",
        rate=1.0,
        users=32,
        turns=4,
        prefixes=400,
        prefix_tokens=8192,
        skew=1.0,
        context_tokens=0,
        question_tokens=64,
        answer_tokens=256,
    ),
}

SPEC_FIELDS = {_camel(k): k for k in asdict(WorkloadSpec())}


def workload_spec(kind: str, overrides: Mapping[str, Any]) -> WorkloadSpec:
    if kind not in PRESETS:
        raise UsageError(
            f"unknown workload '{kind}'",
            fix=f"use one of {', '.join(WORKLOAD_KINDS)}, or --trace FILE.jsonl",
        )
    values = {k: v for k, v in overrides.items() if v is not None}
    spec = replace(PRESETS[kind], **values)
    _check_spec(spec)
    return spec


def _check_spec(spec: WorkloadSpec) -> None:
    positive = ("requests", "users", "turns", "prefixes", "prefix_tokens", "question_tokens")
    for name in positive:
        if getattr(spec, name) < 1:
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} must be at least 1", fix=f"pass {flag} 1 or more")
    for name in ("context_tokens", "answer_tokens"):
        if getattr(spec, name) < 0:
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} must not be negative", fix=f"pass {flag} 0 or more")
    if spec.rate <= 0:
        raise UsageError("--rate must be positive", fix="pass requests per second, e.g. --rate 4")
    if not 0 <= spec.overlap <= 1:
        raise UsageError("--overlap must be between 0 and 1", fix="pass e.g. --overlap 0.6")
    if spec.skew < 0:
        raise UsageError("--skew must not be negative", fix="pass 0 (uniform) or e.g. 1.0 (Zipf)")


def node(node_id: int, start: int, end: int, block: int, chunk: int) -> Node:
    return (node_id, end, end // block - start // block, end // chunk - start // chunk)


class SyntheticWorkload:
    """Streams the requests of a :class:`WorkloadSpec`; the same seed gives the same stream."""

    def __init__(self, spec: WorkloadSpec, *, seed: int, block: int = 16, chunk: int = 256):
        self.spec = spec
        self.seed = seed
        self.block = block
        self.chunk = chunk

    def __iter__(self) -> Iterator[Request]:
        spec, block, chunk = self.spec, self.block, self.chunk
        rng = random.Random(self.seed)
        ids = itertools.count(1)
        length = spec.prefix_tokens
        shared = [node(next(ids), 0, length, block, chunk) for _ in range(spec.prefixes)]
        cumulative = list(
            itertools.accumulate(1.0 / (i + 1) ** spec.skew for i in range(spec.prefixes))
        )
        total = cumulative[-1]
        # per slot: [session id, prefix segment, session segment's token count, turns done]
        sessions: list[list[Any] | None] = [None] * spec.users
        rand, log, users, rate = rng.random, math.log, spec.users, spec.rate
        question, answer, turns = spec.question_tokens, spec.answer_tokens, spec.turns
        t = 0.0
        for _ in range(spec.requests):
            t -= log(1.0 - rand()) / rate  # exponential gaps: Poisson arrivals
            slot = int(rand() * users)
            state = sessions[slot]
            if state is None:
                if rand() < spec.overlap:
                    prefix = shared[bisect.bisect_left(cumulative, rand() * total)]
                else:
                    prefix = node(next(ids), 0, length, block, chunk)
                state = [next(ids), prefix, spec.context_tokens, 0]
                sessions[slot] = state
            session, prefix, own, done = state
            prompt = length + own + question
            # the session segment, inlined node(): (id, end, blocks, chunks)
            lead_b, lead_c = length // block, length // chunk
            path = (prefix, (session, prompt, prompt // block - lead_b, prompt // chunk - lead_c))
            if answer:
                end = prompt + answer
                output = ((session, end, end // block - lead_b, end // chunk - lead_c),)
            else:
                output = ()
            yield (t, session, path, prompt, output)
            done += 1
            if done >= turns:
                sessions[slot] = None
            else:
                state[2] = own + question + answer
                state[3] = done


class TraceWorkload:
    """Requests from a JSONL file, one JSON object a line (streamed; see the README):

    ``{"time": 0.5, "session": "u1", "segments": [["sys-a", 1200], ["q-17", 40]]}`` — segments
    are (content id, tokens) pairs; equal ids at equal positions are the same tokens. Instead of
    ``segments`` a line may give ``tokens`` (token ids) or ``prompt`` (text, ~4 characters a
    token). ``time`` (seconds, non-decreasing) defaults to Poisson arrivals at ``rate``;
    ``session`` (for session routing) defaults to none.
    """

    def __init__(
        self, path: Path, *, rate: float, seed: int, block: int = 16, chunk: int = 256
    ) -> None:
        self.path = path
        self.rate = rate
        self.seed = seed
        self.block = block
        self.chunk = chunk
        if not path.is_file():
            raise UsageError(
                f"trace file {path} does not exist", fix="pass an existing JSONL file to --trace"
            )

    def __iter__(self) -> Iterator[Request]:
        rng = random.Random(self.seed)
        t = 0.0
        with self.path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                where = f"{self.path}:{number}"
                record = _json_object(line, where)
                if "time" in record:
                    at = _number(record["time"], where, "time")
                    if at < t:
                        raise UsageError(
                            f"{where}: time {at} is earlier than the line before ({t})",
                            fix="sort the trace by time",
                        )
                    t = at
                else:
                    t += rng.expovariate(self.rate)
                path = self._path(record, where)
                session = record.get("session")
                yield (t, session, path, path[-1][1], ())

    def _path(self, record: Mapping[str, Any], where: str) -> tuple[Node, ...]:
        if "segments" in record:
            pieces = _segments(record["segments"], where)
        elif "tokens" in record:
            pieces = _token_blocks(record["tokens"], where, self.block)
        elif "prompt" in record:
            pieces = _text_blocks(record["prompt"], where, self.block)
        else:
            raise UsageError(
                f"{where}: a trace line needs 'segments', 'tokens' or 'prompt'",
                fix='write e.g. {"segments": [["system", 1200], ["question-1", 50]]}',
            )
        path, parent, end = [], b"", 0
        for content, length in pieces:
            digest = hashlib.blake2b(parent + content, digest_size=8).digest()
            path.append(
                node(int.from_bytes(digest, "big"), end, end + length, self.block, self.chunk)
            )
            parent, end = digest, end + length
        if not path:
            raise UsageError(f"{where}: the prompt is empty", fix="give at least one token")
        return tuple(path)


def _json_object(line: str, where: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{where}: not valid JSON ({exc.msg})", fix="write one JSON object a line"
        ) from None
    if not isinstance(record, dict):
        raise UsageError(f"{where}: expected a JSON object", fix="write one JSON object a line")
    return record


def _number(value: Any, where: str, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"{where}: '{key}' must be a number", fix=f"write '{key}' in seconds")
    return float(value)


def _segments(value: Any, where: str) -> list[tuple[bytes, int]]:
    pieces = []
    for item in value if isinstance(value, list) else [None]:
        ok = isinstance(item, list) and len(item) == 2 and isinstance(item[1], int)
        if not ok or item[1] < 1 or isinstance(item[1], bool):
            raise UsageError(
                f"{where}: each segment must be [content id, tokens > 0], got {item!r}",
                fix='write e.g. "segments": [["system", 1200], ["question-1", 50]]',
            )
        pieces.append((str(item[0]).encode(), item[1]))
    return pieces


def _token_blocks(value: Any, where: str, block: int) -> list[tuple[bytes, int]]:
    if not isinstance(value, list) or not all(isinstance(t, int) for t in value):
        raise UsageError(f"{where}: 'tokens' must be a list of token ids", fix="write integers")
    return [
        (repr(value[i : i + block]).encode(), len(value[i : i + block]))
        for i in range(0, len(value), block)
    ]


def _text_blocks(value: Any, where: str, block: int) -> list[tuple[bytes, int]]:
    if not isinstance(value, str):
        raise UsageError(f"{where}: 'prompt' must be a string", fix="write the prompt text")
    width = 4 * block  # ~4 characters a token
    return [
        (value[i : i + width].encode(), max(1, len(value[i : i + width]) // 4))
        for i in range(0, len(value), width)
    ]


def refine(request: Request, block: int, chunk: int) -> Request:
    """The same request with every segment split into single blocks (ids derived from the
    segment's): the block-by-block form that segments compress. Tests compare the two."""
    t, session, path, prompt, output = request

    def split(nodes: tuple[Node, ...], start: int) -> tuple[Node, ...]:
        fine = []
        for node_id, end, _blocks, _chunks in nodes:
            pos = start
            while pos < end:
                nxt = min((pos // block + 1) * block, end)
                # one id per (segment, absolute block): the same block in every version
                fine.append(node(-((node_id << 24) | (pos // block)), pos, nxt, block, chunk))
                pos = nxt
            start = end
        return tuple(fine)

    return (t, session, split(path, 0), prompt, split(output, prompt))
