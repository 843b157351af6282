"""AwsClients.prepare: clients built in the background before a run needs them; errors left to
the caller that needs the client."""

from __future__ import annotations

import pytest

from hpkv.aws import AwsClients
from hpkv.config import Settings
from hpkv.errors import UsageError
from tests.harness.aws import AwsEmulator


def test_prepare_builds_the_clients_in_the_background(aws_env: AwsEmulator) -> None:
    clients = AwsClients(Settings({}))
    assert clients.built == frozenset()
    clients.prepare(["sagemaker", "eks"]).join(timeout=60)
    assert clients.built == {"sagemaker", "eks"}
    mark = aws_env.mark()
    assert clients.sagemaker.list_clusters()["ClusterSummaries"] == []  # a working client
    assert [call.action for call in aws_env.calls_since(mark)] == ["ListClusters"]


def test_prepare_leaves_errors_to_the_caller_that_needs_the_client(aws_env: AwsEmulator) -> None:
    clients = AwsClients(Settings({"region": "us-wset-2"}))
    clients.prepare(["sagemaker", "eks"]).join(timeout=60)  # no exception escapes the thread
    assert clients.built == frozenset()
    with pytest.raises(UsageError) as caught:
        clients.client("eks")
    assert caught.value.one_line() == (
        "unknown AWS region 'us-wset-2'. Fix: did you mean --region us-west-2?"
    )
