"""`hpkv diagnose --bundle`: contents, redaction of planted secrets everywhere, the size cap."""

from __future__ import annotations

import base64
import http.server
import json
import os
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.harness.aws import HPKV_ACCESS_KEY, SECRET_KEY
from tests.harness.play import add_pod
from tests.health.conftest import (
    CURVINE_NS,
    ENDPOINT_NS,
    WORKER_RS,
    Installation,
    validate,
    worker_container,
)

pytestmark = [pytest.mark.kube, pytest.mark.aws]

HF_TOKEN = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"
DB_PASSWORD = "plain-words-but-secret-42"  # matches no pattern: only the Secret reveals it
AWS_KEY_ID = "AKIAIOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
SESSION_TOKEN = "IQoJb3JpZ2luX2VjEJr//////////wEaCXVzLXdlc3QtMiJHMEUCIQD0example0token"
BEARER = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhZG1pbiJ9.c2lnbmF0dXJlLXBhcnQ"
EKS_TOKEN = "k8s-aws-v1.aHR0cHM6Ly9zdHMuYW1hem9uYXdzLmNvbS8_QWN0aW9uPUdldENhbGxlcklkZW50aXR5"


@pytest.fixture
def curvine_api(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"master_state": "Active", "live_workers": 2, "lost_workers": 0})
            self.send_response(200 if self.path == "/api/overview" else 404)
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: object) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    routes = {
        f"{CURVINE_NS}/services/curvine-master:9000": f"http://127.0.0.1:{server.server_port}"
    }
    monkeypatch.setenv("HPKV_INCLUSTER_ROUTES", json.dumps(routes))
    yield
    server.shutdown()


def _plant_secrets(inst: Installation) -> None:
    kube = inst.kube
    for namespace, name, data in (
        (ENDPOINT_NS, "hf-token", {"token": HF_TOKEN}),
        (CURVINE_NS, "db", {"password": DB_PASSWORD}),
    ):
        kube.apply_object(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": name, "namespace": namespace},
                "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
            }
        )
    env = {
        "HF_TOKEN": HF_TOKEN,
        "AWS_ACCESS_KEY_ID": AWS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
        "DATABASE_URL": f"postgres://app:{DB_PASSWORD}@db:5432/cache",
        "NOTE": f"creds {AWS_KEY_ID} {DB_PASSWORD}",
    }
    add_pod(
        kube,
        ENDPOINT_NS,
        f"{WORKER_RS}-w0",
        node=inst.nodes[0],
        owner=("ReplicaSet", WORKER_RS),
        containers=[worker_container(env=env)],
    )
    kube.apply_object(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "settings",
                "namespace": ENDPOINT_NS,
                "annotations": {"example.com/auth": f"Authorization: Bearer {BEARER}"},
            },
            "data": {
                "app.env": f"HF_TOKEN={HF_TOKEN}\nDB={DB_PASSWORD}\n",
                "aws.ini": f"[default]\naws_session_token = {SESSION_TOKEN}\n",
            },
        }
    )
    inst.log(
        ENDPOINT_NS, f"{WORKER_RS}-w0", "vllm",
        f"INFO start\nDEBUG token {EKS_TOKEN}\nDEBUG sts X-Amz-Security-Token={SESSION_TOKEN}\n"
        f"DEBUG header Authorization: Bearer {BEARER}\nDEBUG connecting with {DB_PASSWORD}\n"
        f"DEBUG hf {HF_TOKEN} key {AWS_KEY_ID}/{AWS_SECRET}\n",
    )  # fmt: skip
    inst.log(ENDPOINT_NS, f"{WORKER_RS}-w0", "vllm", f"crashed with {DB_PASSWORD}\n", previous=True)


def _members(path: Path) -> dict[str, str]:
    with tarfile.open(path) as archive:
        return {
            member.name.split("/", 1)[1]: archive.extractfile(member).read().decode()  # type: ignore[union-attr]
            for member in archive.getmembers()
            if member.isfile()
        }


def test_bundle_collects_everything_and_leaks_no_secret(
    installation: Installation, curvine_api: None, tmp_path: Path
) -> None:
    _plant_secrets(installation)
    target = tmp_path / "support.tar.gz"
    result = installation.scenario.hpkv(
        "diagnose", "--cluster", "demo", "-o", "json", "--bundle", str(target)
    )
    assert result.exit_code == 0, result
    document = json.loads(result.stdout)
    validate(document, "diagnose")
    assert document["bundle"]["path"] == str(target)
    assert document["bundle"]["bytes"] == target.stat().st_size
    assert oct(target.stat().st_mode & 0o777) == "0o600"
    assert "collecting the support bundle" in result.stderr

    members = _members(target)
    planted = [
        HF_TOKEN, DB_PASSWORD, AWS_KEY_ID, AWS_SECRET, SESSION_TOKEN, BEARER, EKS_TOKEN,
        base64.b64encode(HF_TOKEN.encode()).decode(), SECRET_KEY, HPKV_ACCESS_KEY,
        installation.kube.tokens["hpkv"],
    ]  # fmt: skip
    for name, text in members.items():
        for secret in planted:
            assert secret not in text, f"{secret[:12]}... leaked into {name}"
            assert secret not in name

    summary = json.loads(members["summary.json"])
    assert summary["kind"] == "hpkv.diagnose" and summary["findings"] == []
    assert json.loads(members["manifest.json"])["files"] == sorted(
        set(members) - {"manifest.json"}, key=list(members).index
    )
    for expected in (
        "hpkv.yaml",
        "aws/sagemaker-describe-cluster.json",
        "aws/eks-describe-cluster.json",
        "kubernetes/cluster/nodes.yaml",
        "kubernetes/aws-hyperpod/daemonsets.yaml",
        f"kubernetes/{ENDPOINT_NS}/pods.yaml",
        f"kubernetes/{ENDPOINT_NS}/configmaps.yaml",
        f"kubernetes/{CURVINE_NS}/persistentvolumeclaims.yaml",
        f"logs/{ENDPOINT_NS}/{WORKER_RS}-w0/vllm.log",
        f"logs/{ENDPOINT_NS}/{WORKER_RS}-w0/vllm.previous.log",
        "curvine/api-overview.json",
    ):
        assert expected in members, sorted(members)
    assert json.loads(members["curvine/api-overview.json"])["master_state"] == "Active"
    secrets = yaml.safe_load(members[f"kubernetes/{ENDPOINT_NS}/secrets.yaml"])
    assert secrets == [{"name": "hf-token", "type": "Opaque"}]
    pods = yaml.safe_load(members[f"kubernetes/{ENDPOINT_NS}/pods.yaml"])
    worker = next(p for p in pods if p["metadata"]["name"] == f"{WORKER_RS}-w0")
    env = {e["name"]: e["value"] for e in worker["spec"]["containers"][0]["env"]}
    assert env["HF_TOKEN"] == env["AWS_SECRET_ACCESS_KEY"] == "<redacted>"
    assert env["LMCACHE_REMOTE_URL"].startswith("fs://")  # ordinary values stay readable
    assert "managedFields" not in worker["metadata"]
    log = members[f"logs/{ENDPOINT_NS}/{WORKER_RS}-w0/vllm.log"]
    assert "DEBUG connecting with <redacted>" in log and "INFO start" in log
    role_errors = [
        e for e in json.loads(members["manifest.json"])["errors"] if "IAM role" in e["what"]
    ]
    assert role_errors  # the seeded execution role does not exist in IAM: recorded, not fatal


def test_size_cap_keeps_the_summary_and_drops_what_does_not_fit(
    installation: Installation, tmp_path: Path
) -> None:
    noise = os.urandom(600 * 1024).hex()  # incompressible
    installation.log(ENDPOINT_NS, f"{WORKER_RS}-w1", "vllm", noise, previous=True)
    target = tmp_path / "small.tgz"
    result = installation.scenario.hpkv(
        "diagnose", "--cluster", "demo", "--bundle", str(target), "--max-size", "256KiB",
        "--log-lines", "100000",
    )  # fmt: skip
    assert result.exit_code == 0, result
    assert target.stat().st_size <= 256 * 1024
    members = _members(target)
    assert "summary.json" in members and "manifest.json" in members
    skipped = json.loads(members["manifest.json"])["skipped"]
    assert {
        "name": f"logs/{ENDPOINT_NS}/{WORKER_RS}-w1/vllm.previous.log",
        "reason": "size cap",
    } in skipped
    assert "left out by the size cap" in result.stdout


def test_bundle_path_in_a_missing_directory_is_one_line(installation: Installation) -> None:
    result = installation.scenario.hpkv(
        "diagnose", "--cluster", "demo", "--bundle", "/nonexistent/dir/b.tar.gz"
    )
    assert result.exit_code == 3
    assert result.stderr.strip().splitlines() == [
        "hpkv: error: cannot write the bundle to /nonexistent/dir/b.tar.gz: /nonexistent/dir is "
        "not a directory. Fix: pass a path in an existing directory, e.g. --bundle "
        "./hpkv-bundle.tar.gz"
    ]
    bad_size = installation.scenario.hpkv(
        "diagnose", "--cluster", "demo", "--bundle", "x.tgz", "--max-size", "lots"
    )
    assert bad_size.exit_code == 3 and "invalid size 'lots'" in bad_size.stderr
