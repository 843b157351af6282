"""The pod-log seam: HPKV_POD_LOGS_DIR serves saved logs (the test cluster has no kubelet)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpkv.kube import podlogs


def test_logs_from_a_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(podlogs.LOGS_DIR_ENV, str(tmp_path))
    pod_dir = tmp_path / "ns" / "pod-1"
    pod_dir.mkdir(parents=True)
    (pod_dir / "main.log").write_text("".join(f"line {i}\n" for i in range(10)))
    (pod_dir / "main.previous.log").write_text("before the restart\n")
    kube = object()  # never used with the override
    assert podlogs.read_log(kube, "ns", "pod-1", "main", tail_lines=2) == "line 8\nline 9\n"  # type: ignore[arg-type]
    assert podlogs.read_log(kube, "ns", "pod-1", "main", previous=True) == "before the restart\n"  # type: ignore[arg-type]
    assert podlogs.read_log(kube, "ns", "pod-1", "sidecar") is None  # type: ignore[arg-type]
    # The head of the log, as the API's limitBytes gives it (start-up messages come first).
    head = podlogs.read_log(kube, "ns", "pod-1", "main", tail_lines=None, limit_bytes=9)  # type: ignore[arg-type]
    assert head == "line 0\nli"


def test_the_variable_is_not_a_config_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hpkv.config import load_settings

    monkeypatch.chdir(tmp_path)
    settings = load_settings(environ={podlogs.LOGS_DIR_ENV: str(tmp_path)})
    assert "podLogsDir" not in settings.data
