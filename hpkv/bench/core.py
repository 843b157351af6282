"""One ``hpkv bench run`` end to end: find the endpoint, plan, run each scenario, assemble results.

For each scenario hpkv snapshots every worker pod's ``/metrics`` (through the API server's pod
proxy), runs the runner (as a Job in the cluster, or in-process with ``--from-here``), snapshots
again, merges the client pods' raw timings and summarises. The cross-pod scenario's per-request
hit and L2 figures come from the runner's own /metrics reads around each request; where LMCache's
retrieve histogram is missing they are filled from pod B's LMCache log lines.
"""

from __future__ import annotations

import asyncio
import datetime
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpkv.bench import SCENARIOS, results
from hpkv.bench.endpoint import EndpointInfo, PodInfo, discover, require_pods
from hpkv.errors import ApiError, HpkvError, UsageError
from hpkv.stages.base import Action, Plan, Verb

if TYPE_CHECKING:
    from hpkv.bench.job import JobLauncher, JobSettings
    from hpkv.bench.metrics import MetricsScraper
    from hpkv.context import RunContext

DEFAULT_LENGTHS = [500, 1000, 1500, 2000, 2500, 3000]
APIS = ("completions", "chat")
CROSS_POD_DEFAULTS: dict[str, Any] = {
    "lengths": DEFAULT_LENGTHS,
    "repetitions": 3,
    "maxTokens": 5,
    "settleTimeoutS": 5.0,
}
SHARED_PREFIX_DEFAULTS: dict[str, Any] = {
    "prefixes": 4,
    "prefixTokens": 1000,
    "users": 32,
    "suffixTokens": 100,
    "requests": 128,
    "concurrency": 8,
    "rate": None,
    "maxTokens": 32,
    "via": "router",
    "driver": "hpkv",
    "shuffle": True,
}
MULTI_TURN_DEFAULTS: dict[str, Any] = {
    "sessions": 8,
    "turns": 4,
    "systemTokens": 500,
    "firstTurnTokens": 500,
    "turnTokens": 200,
    "maxTokens": 64,
    "via": "router",
    "thinkTimeS": 0.0,
}


@dataclass
class BenchOptions:
    scenarios: list[str]
    endpoint: str | None = None
    namespace: str | None = None
    from_here: bool = False
    url: str | None = None
    pod_urls: list[str] = field(default_factory=list)
    clients: int = 1
    results_dir: str | None = None
    api: str = "completions"
    model: str | None = None
    port: int | None = None
    image: str | None = None
    seed: int | None = None
    keep_job: bool = False
    request_timeout_s: float = 600.0
    pod_a: str | None = None
    pod_b: str | None = None
    cross_pod: dict[str, Any] = field(default_factory=dict)
    shared_prefix: dict[str, Any] = field(default_factory=dict)
    multi_turn: dict[str, Any] = field(default_factory=dict)


def expand_scenarios(values: list[str]) -> list[str]:
    chosen: list[str] = []
    for value in values or ["all"]:
        for item in value.split(","):
            item = item.strip()
            if item == "all":
                chosen += list(SCENARIOS)
            elif item in SCENARIOS:
                chosen.append(item)
            else:
                raise UsageError(
                    f"unknown scenario '{item}'",
                    fix=f"use one of {', '.join(SCENARIOS)} or all",
                )
    return [s for s in SCENARIOS if s in chosen]


def validate_options(options: BenchOptions) -> None:
    if not options.from_here and not options.endpoint:
        raise UsageError(
            "no endpoint given",
            fix="pass --endpoint NAME (an InferenceEndpointConfig), or --from-here with --url/--pod-url",
        )
    if options.from_here and not (options.endpoint or options.url or options.pod_urls):
        raise UsageError(
            "--from-here needs a target",
            fix="pass --url URL (the endpoint) and/or --pod-url URL for each pod, or --endpoint NAME",
        )
    if not options.from_here and (options.url or options.pod_urls):
        raise UsageError(
            "--url and --pod-url are for --from-here runs",
            fix="add --from-here, or drop them to run inside the cluster",
        )
    for url in [options.url or "", *options.pod_urls]:
        check_not_https_routing(url)
    if options.clients < 1:
        raise UsageError("--clients must be at least 1", fix="pass --clients 1 or more")
    if options.from_here and options.clients > 1:
        raise UsageError(
            "--clients runs several client pods in the cluster; it does not apply with --from-here",
            fix="drop --clients, or raise --concurrency for more load from here",
        )
    if options.api not in APIS:
        raise UsageError(f"unknown --api '{options.api}'", fix="use completions or chat")
    lengths = options.cross_pod.get("lengths") or []
    if any(length < 2 for length in lengths):
        raise UsageError("prompt lengths must be at least 2 tokens", fix="e.g. --lengths 500,1000")
    shared = {**SHARED_PREFIX_DEFAULTS, **options.shared_prefix}
    if shared["driver"] == "vllm" and options.from_here and "shared-prefix" in options.scenarios:
        raise UsageError(
            "--driver vllm runs 'vllm bench serve' from the serving image, inside the cluster",
            fix="drop --from-here, or use --driver hpkv",
        )
    if shared["requests"] < shared["prefixes"]:
        raise UsageError(
            f"--requests {shared['requests']} is less than --prefixes {shared['prefixes']}",
            fix="send at least one request per shared prefix",
        )


def new_run_id() -> str:
    return datetime.datetime.now().strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


@dataclass
class Prepared:
    run_id: str
    spec: dict[str, Any]
    inputs: dict[str, Any]
    environment: dict[str, Any]
    pods: list[dict[str, str]]
    endpoint: EndpointInfo | None = None
    job: JobSettings | None = None
    scraper: MetricsScraper | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class RunOutput:
    result: dict[str, Any]
    directory: Path
    files: dict[str, str]


class Bench:
    def __init__(self, ctx: RunContext, options: BenchOptions) -> None:
        self.ctx = ctx
        self.options = options
        self.config = ctx.settings.section("bench")

    # --- preparation (reads only) ------------------------------------------------------------
    def prepare(self) -> Prepared:
        options = self.options
        validate_options(options)
        run_id = new_run_id()
        seed = options.seed if options.seed is not None else secrets.randbelow(2**31)
        info = None
        if options.endpoint:
            info = discover(
                self.ctx.kube,
                options.endpoint,
                options.namespace,
                port=options.port or self.config.get("port"),
            )
            needed = 2 if "cross-pod" in options.scenarios else 1
            require_pods(info, needed, "cross-pod" if needed == 2 else "the bench")
        pods, router = self._targets(info)
        if "cross-pod" in options.scenarios and len(pods) < 2:
            raise UsageError(
                "the cross-pod scenario needs two pods",
                fix="pass --pod-url twice (pod A, then pod B), or pick other scenarios",
            )
        spec = self._spec(run_id, seed, pods, router)
        prepared = Prepared(
            run_id=run_id,
            spec=spec,
            inputs=self._inputs(seed, pods, router, info),
            environment=self._environment(info, pods, router),
            pods=pods,
            endpoint=info,
        )
        prepared.scraper = self._scraper(info, pods)
        if info is not None and info.not_ready:
            prepared.notes.append("pods not ready, left out: " + ", ".join(info.not_ready))
        if not options.from_here:
            prepared.job = self._job_settings(run_id, info)
            prepared.environment["runnerImage"] = prepared.job.image
            if options.clients > 1:
                spec["barriers"] = {
                    name: self._barrier(prepared.job, name) for name in options.scenarios
                }
        return prepared

    def _barrier(self, settings: JobSettings, scenario: str) -> dict[str, Any] | None:
        from hpkv.bench.job import barrier_for

        return barrier_for(settings, scenario, self._clients_for(scenario))

    def _clients_for(self, scenario: str) -> int:
        return 1 if scenario == "cross-pod" else self.options.clients

    def _targets(
        self, info: EndpointInfo | None
    ) -> tuple[list[dict[str, str]], dict[str, str] | None]:
        """(pods as {name, url}, router as {name, url} or None) for the runner."""
        options = self.options
        pods: list[dict[str, str]] = [_named_url(u) for u in options.pod_urls]
        router = {"name": "router", "url": options.url} if options.url else None
        if info is None:
            return pods, router
        ordered = _cross_pod_order(info.pods, options.pod_a, options.pod_b)
        if not pods:
            pods = [{"name": p.name, "url": self._pod_url(info, p)} for p in ordered]
        if router is None and info.router is not None:
            router = {"name": info.router.service, "url": self._router_url(info)}
        return pods, router

    def _pod_url(self, info: EndpointInfo, pod: PodInfo) -> str:
        if not self.options.from_here:
            return info.pod_url(pod)
        from hpkv.kube.incluster import ROUTES_ENV, route

        url = route(info.namespace, "pods", pod.name, info.port)
        if url is None:
            raise UsageError(
                f"--from-here cannot reach pod {info.namespace}/{pod.name}:{info.port}",
                fix=f"port-forward it and map it in {ROUTES_ENV} "
                f'(e.g. {{"{info.namespace}/pods/{pod.name}:{info.port}": "http://127.0.0.1:8001"}}), '
                "or pass --pod-url",
            )
        return url

    def _router_url(self, info: EndpointInfo) -> str:
        assert info.router is not None
        if not self.options.from_here:
            return info.router.url
        from hpkv.kube.incluster import route

        return (
            route(info.router.namespace, "services", info.router.service, info.router.port)
            or info.router.url
        )

    def _parameters(self) -> dict[str, dict[str, Any]]:
        """Each scenario's parameters, defaults filled in (spec and result inputs share them)."""
        options = self.options
        return {
            "crossPod": {**CROSS_POD_DEFAULTS, "podA": 0, "podB": 1, **options.cross_pod},
            "sharedPrefix": {**SHARED_PREFIX_DEFAULTS, **options.shared_prefix},
            "multiTurn": {**MULTI_TURN_DEFAULTS, **options.multi_turn},
        }

    def _spec(
        self, run_id: str, seed: int, pods: list[dict[str, str]], router: dict[str, str] | None
    ) -> dict[str, Any]:
        options = self.options
        return {
            "version": 1,
            "runId": run_id,
            "seed": seed,
            "api": options.api,
            "model": options.model,
            "pods": pods,
            "router": router,
            "clients": options.clients,
            "requestTimeoutS": options.request_timeout_s,
            **self._parameters(),
        }

    def _inputs(
        self,
        seed: int,
        pods: list[dict[str, str]],
        router: dict[str, str] | None,
        info: EndpointInfo | None,
    ) -> dict[str, Any]:
        options = self.options
        chosen = {
            key: value if scenario in options.scenarios else None
            for (key, value), scenario in zip(self._parameters().items(), SCENARIOS, strict=True)
        }
        return {
            "endpoint": info.ref if info else None,
            "scenarios": list(options.scenarios),
            "location": "from-here" if options.from_here else "in-cluster",
            "clients": options.clients,
            "api": options.api,
            "seed": seed,
            "urls": {"router": router["url"] if router else None, "pods": [p["url"] for p in pods]},
            **chosen,
        }

    def _environment(
        self, info: EndpointInfo | None, pods: list[dict[str, str]], router: dict[str, str] | None
    ) -> dict[str, Any]:
        env: dict[str, Any] = {
            "cluster": self.ctx.settings.cluster,
            "model": self.options.model,
            "replicas": None,
            "instanceType": None,
            "image": None,
            "router": router,
            "pods": [{"name": p["name"], "url": p["url"]} for p in pods],
        }
        if info is not None:
            env.update(info.environment())
            by_name = {p.name: p for p in info.pods}
            env["pods"] = [
                by_name[p["name"]].to_dict(p["url"]) if p["name"] in by_name else p for p in pods
            ]
            try:
                env["kubernetesVersion"] = self.ctx.kube.server_version().get("gitVersion")
            except HpkvError:
                env["kubernetesVersion"] = None
        return env

    def _scraper(self, info: EndpointInfo | None, pods: list[dict[str, str]]) -> MetricsScraper:
        from hpkv.bench.metrics import MetricsScraper

        if info is not None and not self.options.pod_urls:
            return MetricsScraper.through_cluster(self.ctx.kube, info.namespace, info.port)
        return MetricsScraper.direct({p["name"]: p["url"] for p in pods})

    def _job_settings(self, run_id: str, info: EndpointInfo | None) -> JobSettings:
        from hpkv.bench.job import JobSettings

        assert info is not None
        image = self.options.image or self.config.get("image") or info.image
        if not image:
            raise UsageError(
                f"cannot tell the serving image of endpoint {info.ref}",
                fix="pass --image (any image with python3) or set bench.image",
            )
        return JobSettings(
            namespace=info.namespace,
            run_id=run_id,
            image=image,
            python=self.config.get("python", "python3"),
            cpu=str(self.config.get("cpu", "2")),
            memory=str(self.config.get("memory", "2Gi")),
            node_selector=dict(self.config.get("nodeSelector") or {}),
            tolerations=list(self.config.get("tolerations") or []),
            barrier_port=int(self.config.get("barrierPort", 29600)),
            timeout_s=self.ctx.options.timeout,
        )

    def plan(self, prepared: Prepared) -> Plan:
        """What an in-cluster run creates (all of it is deleted when the run ends)."""
        from hpkv.bench.job import configmap_manifest, job_manifest, service_manifest
        from hpkv.kube.objects import comparable, describe

        plan = Plan(stage="bench")
        if prepared.job is None:
            plan.notes.append("runs from here: nothing is created in the cluster")
            return plan
        objects = [configmap_manifest(prepared.job, prepared.spec)]
        for name in self.options.scenarios:
            clients = self._clients_for(name)
            objects.append(job_manifest(prepared.job, name, clients))
            if clients > 1:
                objects.append(service_manifest(prepared.job, name))
        for obj in objects:
            shown = comparable(obj)
            if obj["kind"] == "ConfigMap":
                shown = {**shown, "data": {k: f"<{len(v)} bytes>" for k, v in obj["data"].items()}}
            plan.add(
                Action(
                    describe(obj),
                    Verb.CREATE,
                    "transient: deleted when the run ends",
                    after=shown,
                )
            )
        plan.notes.append(
            f"sends benchmark traffic to endpoint {prepared.endpoint.ref if prepared.endpoint else ''}"
            f" ({', '.join(self.options.scenarios)})"
        )
        return plan

    # --- the run -----------------------------------------------------------------------------
    def run(self, prepared: Prepared) -> tuple[dict[str, Any], HpkvError | None]:
        """The result document, and the error that stopped the run early (the scenarios done
        before it are kept, so a long run is not lost to a late failure)."""
        result = results.new_result(prepared.run_id, prepared.inputs, prepared.environment)
        launcher = self._launcher(prepared)
        failure: HpkvError | None = None
        try:
            if launcher is not None:
                launcher.create_configmap(prepared.spec)
            for name in self.options.scenarios:
                try:
                    result["scenarios"].append(self._scenario(prepared, name, launcher))
                except HpkvError as exc:
                    failure = exc
                    result["notes"].append(f"{name} failed: {exc.one_line()}")
                    break
        finally:
            if launcher is not None:
                deleted = launcher.cleanup()
                if deleted:
                    self.ctx.reporter.debug("deleted " + ", ".join(deleted))
                elif self.options.keep_job:
                    result["notes"].append(
                        f"kept the runner Jobs and ConfigMap (label hpkv.io/bench-run={prepared.run_id})"
                    )
        first = next((s for s in result["scenarios"] if s.get("model")), None)
        if first is not None:
            result["environment"]["model"] = first.get("model")
            result["environment"]["runnerPython"] = first.get("python")
        for doc in result["scenarios"]:
            doc.pop("model", None)
            doc.pop("python", None)
        result["notes"] += prepared.notes
        return result, failure

    def _launcher(self, prepared: Prepared) -> JobLauncher | None:
        if prepared.job is None:
            return None
        from hpkv.bench.job import JobLauncher

        return JobLauncher(self.ctx, prepared.job, keep=self.options.keep_job)

    def _scenario(
        self, prepared: Prepared, name: str, launcher: JobLauncher | None
    ) -> dict[str, Any]:
        from hpkv.bench.metrics import scenario_metrics

        reporter = self.ctx.reporter
        clients = self._clients_for(name)
        reporter.step(f"scenario {name}" + (f" with {clients} client pods" if clients > 1 else ""))
        pod_names = [p["name"] for p in prepared.pods]
        scraper = prepared.scraper
        before = scraper.snapshot(pod_names) if scraper else {}
        started = time.time()
        if launcher is not None:
            client_results = launcher.run(name, clients)
        else:
            client_results = [self._in_process(prepared.spec, name)]
        after = scraper.snapshot(pod_names) if scraper else {}
        doc = results.merge_clients(name, client_results)
        doc["model"] = client_results[0].get("model")
        doc["python"] = client_results[0].get("python")
        if scraper is not None:
            doc["metrics"] = scenario_metrics(before, after, scraper.source)
            if scraper.errors:
                doc["metrics"]["errors"] = dict(scraper.errors)
                doc["notes"].append(
                    "no /metrics from " + ", ".join(sorted(scraper.errors)) + ": tier rates partial"
                )
                scraper.errors.clear()
        if name == "cross-pod":
            self._fill_from_logs(prepared, doc, started)
        doc["summary"] = results.summarize(doc)
        if doc["requests"] and not any(r.get("ok") for r in doc["requests"]):
            first_error = next((r.get("error") for r in doc["requests"] if r.get("error")), "")
            doc["notes"].append(f"every request failed; first error: {first_error}")
        return doc

    def _in_process(self, spec: dict[str, Any], name: str) -> dict[str, Any]:
        from hpkv.bench import runner

        previous = runner.log_sink
        runner.log_sink = self.ctx.reporter.debug
        try:
            return asyncio.run(runner.run_scenario(spec, name))
        except (runner.BenchError, runner.HttpError) as exc:
            raise ApiError(
                f"bench scenario {name} failed: {exc}",
                fix="check that the URLs reach vLLM servers (GET /v1/models)",
            ) from None
        finally:
            runner.log_sink = previous

    def _fill_from_logs(self, prepared: Prepared, doc: dict[str, Any], started: float) -> None:
        """LMCache log lines of pod B for warm requests that lack histogram figures."""
        from hpkv.bench.metrics import attach_log_figures, parse_lmcache_log
        from hpkv.kube.podlogs import PodLogs

        info = prepared.endpoint
        missing = [
            r for r in doc["requests"] if r.get("role") == "warm" and r.get("l2ReadMs") is None
        ]
        if info is None or not missing or self.options.pod_urls:
            return
        pod_b = doc["parameters"].get("podB")
        try:
            text = PodLogs(self.ctx.kube).read(
                info.namespace,
                pod_b,
                container=info.name,
                since_seconds=int(time.time() - started) + 10,
            )
        except HpkvError as exc:
            doc["notes"].append(f"no LMCache log lines from pod {pod_b}: {exc.one_line()}")
            return
        filled = attach_log_figures(doc["requests"], parse_lmcache_log(text))
        if filled:
            doc["notes"].append(
                f"L2 read figures of {filled} request(s) from pod {pod_b}'s LMCache log"
            )

    # --- files -------------------------------------------------------------------------------
    def results_dir(self, run_id: str) -> Path:
        base = self.options.results_dir or self.config.get("resultsDir") or "hpkv-bench"
        return Path(base).expanduser() / run_id


def write_outputs(result: dict[str, Any], directory: Path) -> dict[str, str]:
    """result.json, report.md and the charts in ``directory``; their paths by kind."""
    from hpkv.bench import charts, report

    directory.mkdir(parents=True, exist_ok=True)
    files = {"result": str(results.save(result, directory / "result.json"))}
    chart_files = charts.render_all(result, directory)
    report_path = directory / "report.md"
    report_path.write_text(report.render(result, chart_files), encoding="utf-8")
    files["report"] = str(report_path)
    for kind, path in chart_files.items():
        files[f"chart:{kind}"] = str(path)
    return files


def check_not_https_routing(url: str) -> None:
    """Refuse https:// to the routing service: it speaks plain HTTP on 443 (every request would
    fail with 'SSL: WRONG_VERSION_NUMBER')."""
    from hpkv.topology import ROUTING_HTTPS

    match = ROUTING_HTTPS.search(url)
    if match:
        fixed = "http://" + match.group(0)[len("https://") :]
        raise UsageError(
            f"{url} calls the routing service with https://, but it speaks plain HTTP on port "
            "443 (requests fail with 'SSL: WRONG_VERSION_NUMBER')",
            fix=f"use {fixed}",
        )


def _named_url(value: str) -> dict[str, str]:
    """'NAME=URL' or 'URL' -> {name, url}."""
    from urllib.parse import urlsplit

    name, sep, url = value.partition("=")
    if not sep or "://" in name:
        name, url = "", value
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(
            f"'{value}' is not an http(s) URL", fix="e.g. --pod-url http://127.0.0.1:8001"
        )
    return {"name": name or parts.netloc, "url": url.rstrip("/")}


def _cross_pod_order(pods: list[PodInfo], pod_a: str | None, pod_b: str | None) -> list[PodInfo]:
    """Pods with A first and B second: B on another node than A when possible (the L2 read then
    crosses nodes, as in the published method)."""
    by_name = {p.name: p for p in pods}
    for wanted in (pod_a, pod_b):
        if wanted and wanted not in by_name:
            raise UsageError(
                f"pod '{wanted}' is not a ready worker pod of the endpoint",
                fix=f"use one of {', '.join(by_name) or '(none)'}",
            )
    first = by_name[pod_a] if pod_a else (pods[0] if pods else None)
    if first is None:
        return []
    rest = [p for p in pods if p is not first]
    if pod_b:
        second = by_name[pod_b]
    else:
        second = next((p for p in rest if p.node != first.node), rest[0] if rest else None)
    if second is None:
        return [first]
    return [first, second] + [p for p in rest if p is not second]


def failed_scenarios(result: dict[str, Any]) -> list[str]:
    """Scenarios in which not a single request succeeded."""
    return [
        doc["name"]
        for doc in result.get("scenarios", [])
        if not any(r.get("ok") for r in doc.get("requests", []))
    ]
