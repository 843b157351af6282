"""hpkv.endpoint rendering and validation (no cluster: what `--dry-run` does offline)."""

from __future__ import annotations

import pytest

from hpkv.endpoint import (
    EndpointOptions,
    check_existing,
    is_completions_endpoint,
    parse_model_source,
    render,
)
from hpkv.errors import PreconditionFailed, UsageError


def test_default_render_matches_the_issue() -> None:
    obj = render(EndpointOptions(name="demo"))
    spec = obj["spec"]
    assert obj["metadata"]["name"] == "demo" and obj["metadata"]["namespace"] == "default"
    assert spec["modelSourceConfig"]["huggingFaceModel"]["modelId"] == "Qwen/Qwen2-7B-Instruct"
    assert spec["instanceType"] == "ml.g6e.4xlarge" and spec["replicas"] == 2
    assert spec["kvCacheSpec"]["enableL1Cache"] is True
    assert spec["kvCacheSpec"]["l2CacheSpec"] == {"l2CacheBackend": "tieredstorage"}
    assert spec["intelligentRoutingSpec"] == {"enabled": True, "routingStrategy": "prefixaware"}
    env = spec["worker"]["environmentVariables"]
    assert {"name": "PYTHONHASHSEED", "value": "0"} in env
    assert {"name": "LMCACHE_REMOTE_SERDE", "value": "naive"} in env


def test_max_model_len_and_served_name_are_set_in_place() -> None:
    args = render(EndpointOptions(name="d", max_model_len=4096, model_name="m"))["spec"]["worker"][
        "args"
    ]
    assert args == ["/opt/ml/model", "--served-model-name", "m", "--max-model-len", "4096"]


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/completions", True),
        ("v1/completions", True),
        ("completions", True),
        ("v1/chat/completions", False),
        ("invocations", False),
    ],
)
def test_completions_endpoint(path: str, expected: bool) -> None:
    assert is_completions_endpoint(path) is expected


def test_source_parsing() -> None:
    config, name = parse_model_source("s3://b/models/Llama-3.1-8B/", region="us-east-1")
    assert config["s3Storage"] == {"bucketName": "b", "region": "us-east-1"}
    assert config["modelLocation"] == "models/Llama-3.1-8B" and name == "Llama-3-1-8B"
    config, name = parse_model_source("huggingface://Qwen/Qwen2-7B-Instruct", region=None)
    assert config["huggingFaceModel"] == {"modelId": "Qwen/Qwen2-7B-Instruct"}
    with pytest.raises(UsageError, match="Hugging Face model sources only"):
        parse_model_source("s3://b/m", region="r", hf_token_secret="s")


def test_existing_endpoint_routing_rules() -> None:
    routed = render(EndpointOptions(name="d"))
    plain = render(EndpointOptions(name="d", routing=False))
    check_existing(routed, routed)
    check_existing(plain, plain)
    check_existing(routed, None)
    with pytest.raises(PreconditionFailed, match="adding routing"):
        check_existing(routed, plain)
    with pytest.raises(PreconditionFailed, match="turning it off"):
        check_existing(plain, routed)


def test_bad_template(tmp_path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("kind: ConfigMap\n")
    with pytest.raises(UsageError, match="is not an InferenceEndpointConfig"):
        render(EndpointOptions(name="d", template=str(path)))
    with pytest.raises(UsageError, match="cannot read template"):
        render(EndpointOptions(name="d", template=str(tmp_path / "missing.yaml")))
