"""Redaction of secrets from text and structured data (support bundle, evidence from logs).

Three layers, applied together (every pattern is linear in the text's length: long log lines
cannot stall it):

* **literals**: exact values known to be secret (every value of the Kubernetes Secrets hpkv can
  read, their base64 form and each long line of multi-line values) are replaced wherever they
  appear; values shorter than ``MIN_LITERAL`` characters are skipped, they would blank out ordinary
  words;
* **patterns** in text: AWS access key ids, AWS session tokens, presigned-URL signatures, bearer and
  basic credentials, EKS tokens (``k8s-aws-v1.``), JWTs, Hugging Face tokens (``hf_``), PEM private
  keys, passwords in URLs, bare 40-character AWS secret keys, and the value of any ``name=value`` / ``name: value`` whose name looks
  secret (``*SECRET*``, ``*TOKEN``, ``*PASSWORD*``, ``*ACCESS_KEY*``, ``*API_KEY*``...);
* **structure** in data: values under secret-looking keys, Kubernetes env entries with a
  secret-looking name, and JSON documents embedded in strings (``last-applied-configuration``).

Redacted values read ``<redacted>``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
from collections.abc import Iterable
from typing import Any

REDACTED = "<redacted>"
MIN_LITERAL = 6

_SECRET_WORDS = (
    r"(?:secret|token|passw(?:or)?d|pwd|credentials?|api[_-]?key|access[_-]?key|"
    r"private[_-]?key|authorization|session[_-]?key)"
)
# A name ending in one of those words (HF_TOKEN, clientSecret, aws_secret_access_key; not
# max_tokens or secretName).
SECRET_NAME = re.compile(_SECRET_WORDS + "$", re.IGNORECASE)

# (pattern, replacement); applied in order.
_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(
            r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.DOTALL
        ),
        REDACTED,
    ),
    # presigned URLs: keep the parameter name
    (
        re.compile(r"(X-Amz-(?:Signature|Credential|Security-Token)=)[^&\s\"'<>]+", re.I),
        rf"\1{REDACTED}",
    ),
    # AWS session tokens (STS) start with these base64 prefixes
    (re.compile(r"(?:IQoJb3JpZ2lu|FwoGZXIvYXdz|AQoDYXdz)[A-Za-z0-9+/=]{16,}"), REDACTED),
    # AWS access key ids (long-term and temporary)
    (re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"), REDACTED),
    (re.compile(r"k8s-aws-v1\.[A-Za-z0-9_\-]+"), REDACTED),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]+"), REDACTED),
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}\b"), REDACTED),
    (re.compile(r"\b(Bearer|Basic)(\s+)[A-Za-z0-9\-._~+/]+=*", re.I), rf"\1\2{REDACTED}"),
    # user:password@ in URLs
    (
        re.compile(r"(?<![A-Za-z0-9+.-])([a-z][a-z0-9+.-]{0,30}://[^/\s:@]+):[^/\s@]+@", re.I),
        rf"\1:{REDACTED}@",
    ),
    # a bare 40-character AWS secret access key (base64 with both cases and a / or +)
    (
        re.compile(
            r"(?<![A-Za-z0-9+=])(?=[A-Za-z0-9/+]{0,39}[/+])(?=[A-Za-z0-9/+]{0,39}[a-z])"
            r"(?=[A-Za-z0-9/+]{0,39}[A-Z])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])"
        ),
        REDACTED,
    ),
    # NAME=value, NAME: value, "name": "value" with a secret-looking NAME
    (
        re.compile(
            r"""(?<![A-Za-z0-9_.\-])(?P<name>[A-Za-z0-9_.\-]{0,64}"""
            + _SECRET_WORDS
            + r""")(?P<sep>["']?\s*[:=]\s*["']?)"""
            + r"""(?!(?:Bearer|Basic)\b|<redacted>)(?P<value>[^\s"',;&}\]]{4,})""",
            re.I,
        ),
        rf"\g<name>\g<sep>{REDACTED}",
    ),
]


class Redactor:
    def __init__(self, literals: Iterable[str] = ()) -> None:
        self._literals: set[str] = set()
        self._literal_re: re.Pattern[str] | None = None
        for value in literals:
            self.add(value)

    def add(self, value: str) -> None:
        """Treat ``value`` as secret (plus its base64 form and each long line of it)."""
        if not isinstance(value, str):
            return
        candidates = {value.strip(), base64.b64encode(value.encode()).decode()}
        if "\n" in value:
            candidates.update(line.strip() for line in value.splitlines() if len(line) >= 16)
        new = {c for c in candidates if len(c) >= MIN_LITERAL} - self._literals
        if new:
            self._literals |= new
            self._literal_re = None

    def add_secret_data(self, data: dict[str, str] | None) -> None:
        """Add every value of a Secret's ``data`` (base64) as a literal."""
        for encoded in (data or {}).values():
            if not encoded:
                continue
            with contextlib.suppress(ValueError, TypeError):
                self.add(base64.b64decode(encoded).decode("utf-8", errors="replace"))
            self.add(encoded)

    def _literal_pattern(self) -> re.Pattern[str] | None:
        if self._literal_re is None and self._literals:
            ordered = sorted(self._literals, key=len, reverse=True)
            self._literal_re = re.compile("|".join(re.escape(v) for v in ordered))
        return self._literal_re

    def text(self, text: str) -> str:
        literal = self._literal_pattern()
        if literal is not None:
            text = literal.sub(REDACTED, text)
        for pattern, replacement in _PATTERNS:
            text = pattern.sub(replacement, text)
        return text

    def data(self, value: Any) -> Any:
        """A redacted copy of JSON-like data."""
        if isinstance(value, dict):
            if _is_secret_env_entry(value):
                return {**{k: self.data(v) for k, v in value.items()}, "value": REDACTED}
            return {
                k: REDACTED
                if isinstance(v, str) and v and SECRET_NAME.search(str(k))
                else self.data(v)
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [self.data(v) for v in value]
        if isinstance(value, str):
            return self._string(value)
        return value

    def _string(self, value: str) -> str:
        stripped = value.lstrip()
        if stripped[:1] in ("{", "[") and len(stripped) > 1:
            try:
                embedded = json.loads(value)
            except ValueError:
                pass
            else:
                return json.dumps(self.data(embedded))
        return self.text(value)


def _is_secret_env_entry(entry: dict[str, Any]) -> bool:
    name = entry.get("name")
    return (
        isinstance(name, str)
        and isinstance(entry.get("value"), str)
        and bool(entry.get("value"))
        and SECRET_NAME.search(name) is not None
    )


_DEFAULT = Redactor()


def redact_text(text: str) -> str:
    """Pattern-only redaction (no literals), for evidence quoted from logs."""
    return _DEFAULT.text(text)
