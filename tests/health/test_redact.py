"""The redactor: literal secrets, patterns in text, structure in data, linear time."""

from __future__ import annotations

import base64
import json
import os
import time

import pytest

from hpkv.health.redact import REDACTED, Redactor, redact_text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("key AKIAIOSFODNN7EXAMPLE here", f"key {REDACTED} here"),
        ("temp ASIAY34FZKBOKMUTVV7A", f"temp {REDACTED}"),
        (
            "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            f"aws_secret_access_key = {REDACTED}",
        ),
        ("bare wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY.", f"bare {REDACTED}."),
        ("AWS_SESSION_TOKEN=IQoJb3JpZ2luX2VjEJr//////////wEaCXVz", f"AWS_SESSION_TOKEN={REDACTED}"),
        ("tok FwoGZXIvYXdzEJr//////////wEaDExampleToken", f"tok {REDACTED}"),
        ("Authorization: Bearer abc.def-ghi/jk=", f"Authorization: Bearer {REDACTED}"),
        ("auth: Basic dXNlcjpwYXNz", f"auth: Basic {REDACTED}"),
        ("t k8s-aws-v1.aHR0cHM6Ly9zdHMu_x-y", f"t {REDACTED}"),
        ("jwt eyJhbGciOi.eyJzdWIiOi.c2lnbmF0dXJl", f"jwt {REDACTED}"),
        ("HF hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123", f"HF {REDACTED}"),
        ('{"HF_TOKEN": "anything-at-all"}', f'{{"HF_TOKEN": "{REDACTED}"}}'),
        ("password: hunter2hunter2", f"password: {REDACTED}"),
        ("clientSecret=abc123xyz", f"clientSecret={REDACTED}"),
        ("postgres://app:pw123456@db:5432/x", f"postgres://app:{REDACTED}@db:5432/x"),
        (
            "https://s3/x?X-Amz-Signature=abcdef&X-Amz-Security-Token=zzz",
            f"https://s3/x?X-Amz-Signature={REDACTED}&X-Amz-Security-Token={REDACTED}",
        ),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----", REDACTED),
    ],
)
def test_patterns(text: str, expected: str) -> None:
    assert redact_text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "max_tokens=4096 hit tokens: 512 num_tokens=8192",
        "secretName: my-secret",
        "TOKEN_PATH=/var/run/secrets/token DB_PASSWORD_FILE=/etc/pw",
        "/usr/lib/python3.11/site-packages/vllm/engine/llm_engine.py",
        "sha 3f786850e387550fdab836ed7e6dc881de23001b",
        "LMCACHE_REMOTE_URL=fs://localhost:0/mnt/curvine/l2cache/",
    ],
)
def test_ordinary_text_stays_readable(text: str) -> None:
    assert redact_text(text) == text


def test_literals_their_base64_and_lines_of_multiline_values() -> None:
    certificate = "line-one-of-a-long-secret-value\nline-two-of-a-long-secret-value\n"
    redactor = Redactor(["plain-words-but-secret", "abc", certificate])
    assert redactor.text("db plain-words-but-secret ok abc") == f"db {REDACTED} ok abc"
    encoded = base64.b64encode(b"plain-words-but-secret").decode()
    assert redactor.text(f"b64 {encoded}") == f"b64 {REDACTED}"
    assert redactor.text("x line-two-of-a-long-secret-value y") == f"x {REDACTED} y"
    redactor.add_secret_data({"password": base64.b64encode(b"from-a-secret").decode()})
    assert redactor.text("leaked from-a-secret!") == f"leaked {REDACTED}!"


def test_structure() -> None:
    redactor = Redactor()
    pod = {
        "env": [
            {"name": "HF_TOKEN", "value": "x"},
            {"name": "MODEL", "value": "meta-llama/Llama-3.1-8B"},
            {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {"name": "s"}}},
        ],
        "password": "p",
        "automountServiceAccountToken": True,
        "annotations": {
            "last-applied": json.dumps({"env": [{"name": "DB_PASSWORD", "value": "hunter2"}]})
        },
    }
    result = redactor.data(pod)
    assert result["env"][0] == {"name": "HF_TOKEN", "value": REDACTED}
    assert result["env"][1]["value"] == "meta-llama/Llama-3.1-8B"
    assert result["env"][2] == pod["env"][2]
    assert result["password"] == REDACTED
    assert result["automountServiceAccountToken"] is True
    embedded = json.loads(result["annotations"]["last-applied"])
    assert embedded == {"env": [{"name": "DB_PASSWORD", "value": REDACTED}]}


def test_time_is_linear_in_long_lines() -> None:
    redactor = Redactor(["some-literal-secret"])
    for text in (os.urandom(1024 * 1024).hex(), "aB/" * 300_000, ("x" * 90 + "token=") * 20_000):
        started = time.monotonic()
        redactor.text(text)
        assert time.monotonic() - started < 3.0
