"""A mistyped region: refused up front with the closest known one; a failed connection to an
unknown region's endpoint names it too."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpkv.aws import region_hint


def test_a_mistyped_region_gets_the_closest_known_one() -> None:
    hint = region_hint("https://sagemaker.us-wset-2.amazonaws.com/")
    assert hint == "'us-wset-2' is not a known AWS region: did you mean --region us-west-2?"
    assert region_hint("https://eks.eu-centrl-1.amazonaws.com") is not None
    assert region_hint("https://sagemaker.zz-nowhere-9.amazonaws.com/") == (
        "'zz-nowhere-9' is not a known AWS region: pass a valid --region"
    )


def test_known_regions_and_other_endpoints_get_no_hint() -> None:
    assert region_hint("https://sagemaker.us-west-2.amazonaws.com/") is None
    assert region_hint("https://sagemaker.cn-north-1.amazonaws.com.cn/") is None
    assert region_hint("http://127.0.0.1:5000/") is None  # a custom endpoint (the emulator)
    assert region_hint("") is None


def _clients(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, region: str) -> object:
    from hpkv.aws import AwsClients
    from hpkv.config import Settings

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x" * 40)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    return AwsClients(Settings({"region": region}))


def test_a_mistyped_region_is_refused_before_any_call(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Checked against botocore's small partitions.json (not its endpoint data) on every run,
    so a typo never reaches an AWS endpoint (or a custom endpoint that accepts any region)."""
    from hpkv.errors import UsageError

    clients = _clients(monkeypatch, tmp_path, "us-wset-2")
    with pytest.raises(UsageError) as caught:
        _ = clients.region  # type: ignore[attr-defined]
    assert caught.value.one_line() == (
        "unknown AWS region 'us-wset-2'. Fix: did you mean --region us-west-2?"
    )
    assert _clients(monkeypatch, tmp_path, "eu-west-1").region == "eu-west-1"  # type: ignore[attr-defined]


def test_a_region_botocore_does_not_list_yet_is_tried(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clients = _clients(monkeypatch, tmp_path, "zz-nowhere-9")
    assert clients.region == "zz-nowhere-9"  # type: ignore[attr-defined]
