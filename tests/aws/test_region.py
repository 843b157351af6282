"""A mistyped region: named with the closest known one, but only when a connection failed (the
region list is not loaded on every run)."""

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


def test_creating_clients_does_not_load_the_region_list(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The 50-130 ms of botocore endpoint data are spent only on a failure."""
    from hpkv.aws import AwsClients, _known_regions
    from hpkv.config import Settings

    _known_regions.cache_clear()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x" * 40)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    clients = AwsClients(Settings({"region": "us-wset-2"}))
    assert clients.region == "us-wset-2"
    clients.client("sagemaker")
    assert _known_regions.cache_info().currsize == 0
