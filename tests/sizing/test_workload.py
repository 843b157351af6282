"""Workloads: synthetic generators (deterministic, segment bookkeeping) and JSONL traces."""

from __future__ import annotations

import json
from itertools import islice
from pathlib import Path

import pytest

from hpkv.errors import UsageError
from hpkv.sizing.workload import (
    PRESETS,
    SyntheticWorkload,
    TraceWorkload,
    refine,
    workload_spec,
)


def check_segments(path, prompt: int, block: int = 16, chunk: int = 256) -> None:
    assert path[-1][1] == prompt
    assert sum(n[2] for n in path) == prompt // block
    assert sum(n[3] for n in path) == prompt // chunk


@pytest.mark.parametrize("kind", sorted(PRESETS))
def test_presets_stream_consistent_segments(kind: str) -> None:
    spec = workload_spec(kind, {"requests": 500})
    previous = 0.0
    for t, _session, path, prompt, output in SyntheticWorkload(spec, seed=1):
        assert t > previous
        previous = t
        check_segments(path, prompt)
        for node in output:  # the answer extends the session segment
            assert node[0] == path[-1][0]
            assert node[1] == prompt + spec.answer_tokens


def test_the_same_seed_gives_the_same_stream() -> None:
    spec = workload_spec("chat", {"requests": 300})
    first = list(SyntheticWorkload(spec, seed=7))
    assert first == list(SyntheticWorkload(spec, seed=7))
    assert first != list(SyntheticWorkload(spec, seed=8))


def test_a_chat_turn_repeats_the_previous_prompt_and_answer() -> None:
    spec = workload_spec(
        "chat", {"requests": 400, "users": 3, "turns": 4, "context_tokens": 100,
                 "question_tokens": 40, "answer_tokens": 70, "prefix_tokens": 300},
    )  # fmt: skip
    last_prompt: dict[int, int] = {}
    turns: dict[int, int] = {}
    for _t, session, path, prompt, _output in SyntheticWorkload(spec, seed=3):
        assert len(path) == 2 and path[0][1] == 300
        if session in last_prompt:
            assert prompt == last_prompt[session] + 70 + 40
        else:
            assert prompt == 300 + 100 + 40
        last_prompt[session] = prompt
        turns[session] = turns.get(session, 0) + 1
    assert max(turns.values()) == 4


def test_overlap_and_skew_shape_prefix_sharing() -> None:
    def prefixes(**overrides) -> set[int]:
        spec = workload_spec("system-prompt", {"requests": 2000, **overrides})
        return {path[0][0] for _t, _s, path, _p, _o in SyntheticWorkload(spec, seed=1)}

    assert len(prefixes(prefixes=5, overlap=1.0)) == 5
    assert len(prefixes(prefixes=5, overlap=0.0)) == 2000  # every request a private prefix
    skewed = workload_spec("system-prompt", {"requests": 2000, "prefixes": 50, "skew": 1.5})
    counts: dict[int, int] = {}
    for _t, _s, path, _p, _o in SyntheticWorkload(skewed, seed=1):
        counts[path[0][0]] = counts.get(path[0][0], 0) + 1
    assert max(counts.values()) > 2000 / 50 * 5


def test_bad_workload_parameters_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="unknown workload 'chatty'"):
        workload_spec("chatty", {})
    with pytest.raises(UsageError, match="--overlap"):
        workload_spec("chat", {"overlap": 1.5})
    with pytest.raises(UsageError, match="--rate"):
        workload_spec("chat", {"rate": 0})
    with pytest.raises(UsageError, match="--turns"):
        workload_spec("chat", {"turns": 0})


def write_trace(tmp_path: Path, lines: list) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


def test_trace_forms_segments_tokens_and_text(tmp_path: Path) -> None:
    trace = write_trace(
        tmp_path,
        [
            {"time": 0.5, "session": "u1", "segments": [["sys", 300], ["q1", 20]]},
            {"time": 0.7, "segments": [["sys", 300], ["q2", 20]]},
            {"tokens": list(range(40))},
            "",
            {"prompt": "x" * 400},
        ],
    )
    requests = list(TraceWorkload(trace, rate=2.0, seed=0))
    assert len(requests) == 4
    (t1, s1, p1, n1, o1), (t2, s2, p2, n2, _o2) = requests[:2]
    assert (t1, s1, n1, o1, t2, s2, n2) == (0.5, "u1", 320, (), 0.7, None, 320)
    assert p1[0] == p2[0]  # same content id at the same position: the same segment
    assert p1[1][0] != p2[1][0]
    check_segments(p1, 320)
    _t, _s, p3, n3, _o = requests[2]
    assert n3 == 40 and len(p3) == 3  # one segment per 16-token block
    check_segments(p3, 40)
    assert requests[3][3] == 100  # ~4 characters a token
    assert requests[2][0] > 0.7  # no time: Poisson arrivals after the last one


def test_identical_token_prefixes_share_segments(tmp_path: Path) -> None:
    shared = list(range(100))
    trace = write_trace(tmp_path, [{"tokens": [*shared, 1, 2]}, {"tokens": [*shared, 3]}])
    (_, _, a, _, _), (_, _, b, _, _) = TraceWorkload(trace, rate=1, seed=0)
    assert a[:6] == b[:6]  # the six full blocks
    assert a[6][0] != b[6][0]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{oops", "trace.jsonl:2: not valid JSON"),
        ("[1, 2]", "trace.jsonl:2: expected a JSON object"),
        ('{"session": "x"}', "needs 'segments', 'tokens' or 'prompt'"),
        ('{"segments": [["a", 0]]}', "each segment must be"),
        ('{"segments": [["a", 10]], "time": 0.1}', "earlier than the line before"),
        ('{"tokens": ["a"]}', "'tokens' must be a list of token ids"),
    ],
)
def test_trace_errors_name_the_line(tmp_path: Path, line: str, message: str) -> None:
    trace = write_trace(tmp_path, ['{"time": 1.0, "segments": [["a", 10]]}', line])
    with pytest.raises(UsageError, match=message):
        list(TraceWorkload(trace, rate=1, seed=0))


def test_missing_trace_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        TraceWorkload(tmp_path / "none.jsonl", rate=1, seed=0)


def test_refine_splits_segments_into_blocks() -> None:
    spec = workload_spec("chat", {"requests": 50, "prefix_tokens": 100, "context_tokens": 30})
    for request in islice(SyntheticWorkload(spec, seed=2), 50):
        t, session, path, prompt, output = refine(request, 16, 256)
        assert (t, session, prompt) == request[0:1] + request[1:2] + request[3:4]
        check_segments(path, prompt)
        assert all(n[2] <= 1 for n in path)
        assert sum(n[2] for n in output) == output[-1][1] // 16 - prompt // 16
