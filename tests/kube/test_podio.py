"""The pod exec seam: HPKV_POD_ROUTES sends exec to a local service (logs: test_podlogs)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from hpkv.config import load_settings
from hpkv.errors import ApiError, ConnectionFailed, UsageError
from hpkv.kube import KubeClients
from hpkv.kube.podio import PodIO
from hpkv.stages.l2.pods import probe_command
from tests.harness.workloads import FakePods


@pytest.fixture
def io(isolated_env: Path) -> PodIO:
    return PodIO(KubeClients(load_settings()), timeout=5)


def test_exec_runs_through_the_route_and_returns_the_exit_status(
    io: PodIO, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = tmp_path / "pvc"
    storage.mkdir()
    with FakePods(storage) as fake:
        monkeypatch.setenv("HPKV_POD_ROUTES", json.dumps({"team-a/*": fake.url}))
        result = io.exec("team-a", "p1", "demo", probe_command("/mnt/curvine/l2cache", "tok"))
        assert result.ok and result.stdout == "tok"
        assert (storage / ".hpkv-probe").is_dir()  # written under the mapped mount
        assert list((storage / ".hpkv-probe").iterdir()) == []  # and cleaned up
        assert fake.execs[0]["container"] == "demo"
        failed = io.exec("team-a", "p1", "demo", ["sh", "-c", "echo no >&2; exit 3"])
        assert (failed.rc, failed.stderr.strip()) == (3, "no")


def test_exact_route_wins_over_the_namespace_wildcard(
    io: PodIO, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakePods(tmp_path) as one, FakePods(tmp_path) as two:
        routes = {"team-a/*": one.url, "team-a/special": two.url}
        monkeypatch.setenv("HPKV_POD_ROUTES", json.dumps(routes))
        io.exec("team-a", "special", "c", ["true"])
        io.exec("team-a", "other", "c", ["true"])
        assert [e["pod"] for e in two.execs] == ["special"]
        assert [e["pod"] for e in one.execs] == ["other"]


def test_seam_errors_are_one_line_hpkv_errors(io: PodIO, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPKV_POD_ROUTES", "{nope")
    with pytest.raises(UsageError, match="HPKV_POD_ROUTES is not valid JSON"):
        io.exec("team-a", "p", "c", ["true"])
    monkeypatch.setenv("HPKV_POD_ROUTES", json.dumps({"team-a/*": "http://127.0.0.1:9"}))
    with pytest.raises(ConnectionFailed):
        io.exec("team-a", "p", "c", ["true"])


def test_a_bad_answer_is_an_api_error(io: PodIO, monkeypatch: pytest.MonkeyPatch) -> None:
    class NotAKubelet(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            return None

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(500 if body["pod"] == "gone" else 200)
            self.send_header("Content-Length", "5")
            self.end_headers()
            self.wfile.write(b"hello")

    server = ThreadingHTTPServer(("127.0.0.1", 0), NotAKubelet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        monkeypatch.setenv("HPKV_POD_ROUTES", json.dumps({"team-a/*": url}))
        with pytest.raises(ApiError, match="not an exec result"):
            io.exec("team-a", "p", "c", ["true"])
        with pytest.raises(ApiError, match="answered 500: hello"):
            io.exec("team-a", "gone", "c", ["true"])
    finally:
        server.shutdown()
        server.server_close()


def test_the_routes_variable_is_not_a_config_key(
    isolated_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPKV_POD_ROUTES", "{}")
    assert "podRoutes" not in load_settings().data
