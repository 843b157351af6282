"""Health of the whole installation: ``hpkv status`` and ``hpkv diagnose``.

Modules: ``sections`` (what is inspected: the cluster-wide group plus every registered stage),
``cluster`` (the cluster-wide checks), ``status`` (checks run concurrently into one report),
``detectors`` (generic known-failure detectors), ``diagnose`` (detectors run concurrently into
findings), ``iam`` (the IAM policy-simulator preflight), ``redact`` and ``bundle`` (the support
bundle). JSON Schemas of the ``-o json`` documents are in ``schemas/``.
"""

from __future__ import annotations

from pathlib import Path

SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"
