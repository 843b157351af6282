"""Inference endpoints: render, deploy, inspect and delete InferenceEndpointConfigs.

``render`` turns a template (``manifests/inference-endpoint.yaml`` by default) and options into an
InferenceEndpointConfig without touching any API, so ``--dry-run`` works with no cluster and no
credentials. Constraints the operator enforces only after the fact are checked here first, each as
one clear error: ``kvaware`` routing needs the completions invocation endpoint, routing cannot be
added to (or removed from) an existing endpoint, and names longer than 63 characters are refused.
"""

from __future__ import annotations

import copy
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from hpkv.context import poll_interval
from hpkv.errors import (
    AccessDenied,
    ConnectionFailed,
    CredentialsError,
    HpkvError,
    NotFound,
    PreconditionFailed,
    UsageError,
    WaitTimeout,
)
from hpkv.stages.base import Action, ApplyResult, Check, CheckState, Plan, Stage, Verb, worst_state
from hpkv.topology import (
    ENDPOINT_KIND,
    INFERENCE_API_VERSION,
    INFERENCE_GROUP,
    OPERATOR_NAMESPACE,
    REGISTRATION_KIND,
    REQUIRED_WORKER_ENV,
    WORKER_LABEL,
    router_selector,
    routing_service,
)

if TYPE_CHECKING:
    from hpkv.context import RunContext

TEMPLATE = Path(__file__).parent / "manifests" / "inference-endpoint.yaml"
ROUTING_STRATEGIES = ("prefixaware", "kvaware", "session", "roundrobin")
MODEL_SOURCES = ("huggingface", "s3", "fsx")
MAX_NAME = 63
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_MODEL_NAME_CHARS = re.compile(r"[^a-zA-Z0-9-]+")
_HF_ID = re.compile(r"^[a-zA-Z0-9_.-]+/[a-zA-Z0-9_.-]+$")
_FSX_ID = re.compile(r"^fs-[0-9a-f]{8,17}$")
COMPLETE, FAILED = "DeploymentComplete", "DeploymentFailed"
STAGE = "endpoint"


@dataclass
class EndpointOptions:
    """What ``hpkv endpoint deploy`` was asked for; ``None`` keeps the template's value."""

    name: str
    namespace: str = "default"
    model_source: str | None = None
    model_name: str | None = None
    instance_type: str | None = None
    replicas: int | None = None
    routing_strategy: str | None = None
    routing: bool = True
    invocation_endpoint: str | None = None
    max_model_len: int | None = None
    image: str | None = None
    l1: bool | None = None
    l2: bool | None = None
    hf_token_secret: str | None = None
    template: str | None = None


# --- validation -----------------------------------------------------------------------------------
def validate_name(name: str) -> str:
    if len(name) > MAX_NAME:
        raise UsageError(
            f"endpoint name '{name[:20]}...' is {len(name)} characters; the operator allows at "
            f"most {MAX_NAME}",
            fix=f"use a name of {MAX_NAME} characters or fewer",
        )
    if not _NAME.match(name):
        raise UsageError(
            f"endpoint name '{name}' is not a valid Kubernetes name",
            fix="use lowercase letters, digits and '-', starting and ending with a letter or digit",
        )
    return name


def is_completions_endpoint(path: str) -> bool:
    """True for the OpenAI completions API path (``/completions``, ``v1/completions``)."""
    clean = path.strip().strip("/")
    return (clean == "completions" or clean.endswith("/completions")) and not clean.endswith(
        "chat/completions"
    )


def check_routing(strategy: str, invocation_endpoint: str) -> None:
    if strategy == "kvaware" and not is_completions_endpoint(invocation_endpoint):
        raise UsageError(
            f"--routing-strategy kvaware needs the completions invocation endpoint, not "
            f"'{invocation_endpoint}'",
            fix="pass --invocation-endpoint /completions (or v1/completions), or choose "
            "prefixaware, session or roundrobin",
        )


def model_name_from(source: str) -> str:
    base = source.rstrip("/").rsplit("/", 1)[-1] or "model"
    cleaned = _MODEL_NAME_CHARS.sub("-", base).strip("-") or "model"
    return cleaned[:MAX_NAME].rstrip("-")


def parse_model_source(
    value: str, *, region: str | None, hf_token_secret: str | None = None
) -> tuple[dict[str, Any], str]:
    """``hf://org/model``, ``s3://bucket/prefix[?region=R]`` or ``fsx://fs-id/path`` ->
    (modelSourceConfig, default model name)."""
    parts = urlsplit(value)
    scheme = parts.scheme.lower()
    fix = "use hf://ORG/MODEL, s3://BUCKET/PATH or fsx://FILE-SYSTEM-ID/PATH"
    if scheme in ("hf", "huggingface"):
        model_id = f"{parts.netloc}{parts.path}".strip("/")
        if not _HF_ID.match(model_id):
            raise UsageError(f"--model-source {value}: '{model_id}' is not ORG/MODEL", fix=fix)
        hf: dict[str, Any] = {"modelId": model_id}
        if hf_token_secret:
            secret, _, key = hf_token_secret.partition(":")
            hf["tokenSecretRef"] = {"name": secret, "key": key or "token"}
        config = {
            "modelSourceType": "huggingface",
            "huggingFaceModel": hf,
            "prefetchEnabled": False,
        }
        return config, model_name_from(model_id)
    if hf_token_secret:
        raise UsageError(
            "--hf-token-secret applies to Hugging Face model sources only",
            fix="drop it, or use --model-source hf://ORG/MODEL",
        )
    location = parts.path.strip("/")
    if scheme == "s3":
        if not parts.netloc or not location:
            raise UsageError(f"--model-source {value}: give a bucket and a path", fix=fix)
        bucket_region = (parse_qs(parts.query).get("region") or [region])[0]
        if not bucket_region:
            raise UsageError(
                f"--model-source {value}: the bucket's region is unknown",
                fix="pass --region, or append ?region=REGION to the s3:// location",
            )
        config = {
            "modelSourceType": "s3",
            "s3Storage": {"bucketName": parts.netloc, "region": bucket_region},
            "modelLocation": location,
            "prefetchEnabled": False,
        }
        return config, model_name_from(location)
    if scheme == "fsx":
        if not _FSX_ID.match(parts.netloc) or not location:
            raise UsageError(
                f"--model-source {value}: give a file system ID (fs-...) and a path", fix=fix
            )
        config = {
            "modelSourceType": "fsx",
            "fsxStorage": {"fileSystemId": parts.netloc},
            "modelLocation": location,
            "prefetchEnabled": False,
        }
        return config, model_name_from(location)
    raise UsageError(f"--model-source {value}: unknown kind of source", fix=fix)


# --- rendering ------------------------------------------------------------------------------------
def load_template(path: str | None) -> dict[str, Any]:
    import yaml

    source = Path(path).expanduser() if path else TEMPLATE
    try:
        data = yaml.safe_load(source.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(
            f"cannot read template {source}: {exc.strerror or exc}", fix="check --template"
        ) from None
    except yaml.YAMLError:
        raise UsageError(f"template {source} is not valid YAML", fix="fix the file") from None
    if not isinstance(data, dict) or data.get("kind") != ENDPOINT_KIND:
        raise UsageError(
            f"template {source} is not an {ENDPOINT_KIND}",
            fix=f"use a YAML file with kind: {ENDPOINT_KIND}",
        )
    return data


def _set_arg(args: list[str], flag: str, value: str) -> list[str]:
    """Set ``flag VALUE`` in ``args``: in place when present (``flag VALUE`` or ``flag=VALUE``),
    appended otherwise."""
    result = list(args)
    for i, arg in enumerate(result):
        if arg == flag and i + 1 < len(result):
            result[i + 1] = value
            return result
        if arg.startswith(flag + "="):
            result[i] = f"{flag}={value}"
            return result
    return [*result, flag, value]


def _arg_value(args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def ensure_worker_env(worker: dict[str, Any]) -> None:
    env = [e for e in worker.get("environmentVariables") or [] if isinstance(e, dict)]
    names = {name for name in REQUIRED_WORKER_ENV}
    kept = [e for e in env if e.get("name") not in names]
    worker["environmentVariables"] = kept + [
        {"name": name, "value": value} for name, value in REQUIRED_WORKER_ENV.items()
    ]


def render(options: EndpointOptions, *, region: str | None = None) -> dict[str, Any]:
    """The InferenceEndpointConfig for ``options``; raises UsageError on bad combinations."""
    validate_name(options.name)
    obj = copy.deepcopy(load_template(options.template))
    metadata = obj.setdefault("metadata", {})
    metadata["name"] = options.name
    metadata["namespace"] = options.namespace
    spec = obj.setdefault("spec", {})
    worker = spec.setdefault("worker", {})

    default_model_name = None
    if options.model_source:
        spec["modelSourceConfig"], default_model_name = parse_model_source(
            options.model_source, region=region, hf_token_secret=options.hf_token_secret
        )
    elif options.hf_token_secret:
        hf = (spec.get("modelSourceConfig") or {}).get("huggingFaceModel")
        if hf is None:
            raise UsageError(
                "--hf-token-secret applies to Hugging Face model sources only",
                fix="pass --model-source hf://ORG/MODEL as well",
            )
        secret, _, key = options.hf_token_secret.partition(":")
        hf["tokenSecretRef"] = {"name": secret, "key": key or "token"}
    if options.model_name:
        spec["modelName"] = options.model_name
    elif default_model_name:
        spec["modelName"] = default_model_name
    model_name = str(spec.get("modelName") or "")
    if not re.match(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$", model_name):
        raise UsageError(
            f"model name '{model_name}' is not accepted by the operator",
            fix="pass --model-name with up to 63 letters, digits and single '-'",
        )

    if options.instance_type:
        if not options.instance_type.startswith("ml."):
            raise UsageError(
                f"--instance-type {options.instance_type} is not a SageMaker instance type",
                fix="use an ml.* type such as ml.g6e.4xlarge",
            )
        spec["instanceType"] = options.instance_type
        spec.pop("instanceTypes", None)
    if options.replicas is not None:
        spec["replicas"] = options.replicas
    if options.image:
        worker["image"] = options.image

    routing = dict(spec.get("intelligentRoutingSpec") or {})
    strategy = options.routing_strategy or routing.get("routingStrategy") or "prefixaware"
    if options.routing_strategy and not options.routing:
        raise UsageError(
            "--routing-strategy and --no-routing contradict each other", fix="pass only one"
        )
    endpoint = options.invocation_endpoint
    if endpoint is None:
        endpoint = str(spec.get("invocationEndpoint") or "invocations")
        if strategy == "kvaware" and options.routing and not is_completions_endpoint(endpoint):
            endpoint = "v1/completions"
    spec["invocationEndpoint"] = endpoint
    if options.routing:
        check_routing(strategy, endpoint)
        routing.update({"enabled": True, "routingStrategy": strategy})
        spec["intelligentRoutingSpec"] = routing
    else:
        spec.pop("intelligentRoutingSpec", None)

    kv = spec.setdefault("kvCacheSpec", {})
    if options.l1 is not None:
        kv["enableL1Cache"] = options.l1
    if options.l2 is not None:
        kv["enableL2Cache"] = options.l2
    if kv.get("enableL2Cache"):
        l2 = kv.setdefault("l2CacheSpec", {})
        l2.setdefault("l2CacheBackend", "tieredstorage")
    else:
        kv.pop("l2CacheSpec", None)

    args = [str(a) for a in worker.get("args") or []]
    if options.max_model_len is not None:
        args = _set_arg(args, "--max-model-len", str(options.max_model_len))
    if (
        _arg_value(args, "--served-model-name") is not None
        or options.model_name
        or (default_model_name)
    ):
        args = _set_arg(args, "--served-model-name", model_name)
    worker["args"] = args
    ensure_worker_env(worker)
    port = (worker.get("modelInvocationPort") or {}).get("containerPort")
    if port is not None:
        spec.setdefault("metrics", {}).setdefault("modelMetrics", {})["port"] = port
    return obj


def routing_enabled(obj: dict[str, Any] | None) -> bool:
    spec = (obj or {}).get("spec") or {}
    return bool((spec.get("intelligentRoutingSpec") or {}).get("enabled"))


def check_existing(desired: dict[str, Any], live: dict[str, Any] | None) -> None:
    """Refuse routing changes the operator rejects on an existing endpoint."""
    if live is None:
        return
    name = f"{desired['metadata']['namespace']}/{desired['metadata']['name']}"
    if routing_enabled(desired) and not routing_enabled(live):
        raise PreconditionFailed(
            f"endpoint {name} exists without intelligent routing, and the operator rejects "
            "adding routing to an existing endpoint",
            fix="deploy under a new name (or delete it first), or pass --no-routing",
        )
    if routing_enabled(live) and not routing_enabled(desired):
        raise PreconditionFailed(
            f"endpoint {name} has intelligent routing enabled, and the operator does not allow "
            "turning it off",
            fix="deploy under a new name (or delete it first), or keep routing",
        )


def region_hint(ctx: RunContext) -> str | None:
    """The region for S3 model sources, without needing credentials."""
    region = (
        ctx.settings.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    )
    if region:
        return region
    try:
        return ctx.aws.session.region_name
    except HpkvError:
        return None


# --- the cluster side -----------------------------------------------------------------------------
@dataclass
class DryRun:
    object: dict[str, Any]
    server_side: bool
    note: str


@dataclass
class EndpointStatus:
    name: str
    namespace: str
    found: bool
    state: str | None = None
    checks: list[Check] = field(default_factory=list)
    conditions: list[dict[str, Any]] = field(default_factory=list)
    deployment: dict[str, Any] = field(default_factory=dict)
    pods: list[dict[str, Any]] = field(default_factory=list)
    routing_service: dict[str, Any] | None = None
    load_balancer: str | None = None

    @property
    def overall(self) -> CheckState:
        return worst_state(c.state for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "endpoint": f"{self.namespace}/{self.name}",
            "found": self.found,
            "state": self.state,
            "overall": self.overall.value,
            "deploymentStatus": self.deployment,
            "conditions": self.conditions,
            "pods": self.pods,
            "routingService": self.routing_service,
            "loadBalancerHostName": self.load_balancer,
            "checks": [c.to_dict() for c in self.checks],
        }


class Endpoints(Stage):
    """InferenceEndpointConfig operations against the cluster (plans and checks as a stage has)."""

    name = STAGE
    title = "Inference endpoints (InferenceEndpointConfig)"

    def require_crd(self) -> None:
        from hpkv.kube import kube_errors

        try:
            resource = self.ctx.kube.resource(INFERENCE_API_VERSION, ENDPOINT_KIND)
        except NotFound:
            raise PreconditionFailed(
                f"the cluster does not serve {ENDPOINT_KIND} (the inference operator is not "
                "installed)",
                fix="run 'hpkv operator apply'",
            ) from None
        try:
            with kube_errors(f"read CRD {resource.name}.{INFERENCE_GROUP}"):
                crd = self.ctx.kube.apiextensions.read_custom_resource_definition(
                    f"{resource.name}.{INFERENCE_GROUP}"
                )
        except (AccessDenied, NotFound):
            return  # not allowed to read CRDs: the write will tell
        if crd.metadata.deletion_timestamp is not None:
            raise PreconditionFailed(
                f"the {ENDPOINT_KIND} CRD is being deleted (the inference operator is being "
                "removed)",
                fix="wait for 'hpkv operator remove' to finish, then 'hpkv operator apply'",
            )

    def read(self, name: str, namespace: str) -> dict[str, Any] | None:
        from hpkv.kube import objects

        return objects.read(self.ctx.kube, INFERENCE_API_VERSION, ENDPOINT_KIND, name, namespace)

    def _require_namespace(self, namespace: str) -> None:
        from hpkv.kube import is_status, kube_errors

        with kube_errors(f"read namespace {namespace}"):
            try:
                self.ctx.kube.core.read_namespace(namespace)
            except Exception as exc:
                if is_status(exc, 404):
                    raise PreconditionFailed(
                        f"namespace {namespace} does not exist",
                        fix=f"create it ('kubectl create namespace {namespace}') or pass -n",
                    ) from None
                raise

    # --- deploy ---------------------------------------------------------------------------------
    def dry_run(self, obj: dict[str, Any]) -> DryRun:
        """Server-side dry run when a cluster with the CRD is reachable, else the local render."""
        from hpkv.kube import objects

        meta = obj["metadata"]
        try:
            self.require_crd()
            live = self.read(meta["name"], meta["namespace"])
        except (ConnectionFailed, CredentialsError, UsageError, PreconditionFailed) as exc:
            return DryRun(
                obj, False, f"rendered locally (no cluster to validate it: {exc.message})"
            )
        check_existing(obj, live)
        result = objects.apply(self.ctx.kube, obj, dry_run=True)
        result.get("metadata", {}).pop("managedFields", None)
        return DryRun(
            result, True, "server-side dry run: the API server accepted it; nothing was stored"
        )

    def plan_deploy(self, obj: dict[str, Any]) -> Plan:
        from hpkv.kube import objects

        meta = obj["metadata"]
        self.require_crd()
        self._require_namespace(meta["namespace"])
        check_existing(obj, self.read(meta["name"], meta["namespace"]))
        plan = Plan(stage=STAGE)
        plan.add(objects.plan_apply(self.ctx.kube, obj))
        return plan

    def apply(self, plan: Plan) -> ApplyResult:
        result = self.run_plan(plan)
        if self.ctx.options.wait is True:
            for action in plan.actions:
                result.checks.append(self.wait_deployed(*_ref(action)))
        elif result.performed:
            result.notes.append(
                "the operator deploys it now; follow with 'hpkv endpoint status NAME' "
                "(or deploy with --wait)"
            )
        return result

    def wait_deployed(self, name: str, namespace: str) -> Check:
        deadline = time.monotonic() + self.ctx.options.timeout
        with self.ctx.reporter.waiting(f"waiting for endpoint {namespace}/{name} to deploy"):
            while True:
                live = self.read(name, namespace)
                state = ((live or {}).get("status") or {}).get("state")
                if state == COMPLETE:
                    return self.check("state", CheckState.OK, f"{name}: {state}")
                if state == FAILED:
                    detail = _deployment_message(live)
                    raise PreconditionFailed(
                        f"endpoint {namespace}/{name} failed to deploy: {detail}",
                        fix=f"see 'hpkv endpoint status {name} -n {namespace}' and the operator "
                        f"logs (kubectl logs -n {OPERATOR_NAMESPACE} deploy/"
                        "hyperpod-inference-controller-manager)",
                    )
                if time.monotonic() >= deadline:
                    raise WaitTimeout(
                        f"endpoint {namespace}/{name} was not deployed within "
                        f"{int(self.ctx.options.timeout)}s (state {state or 'none yet'})",
                        fix=f"check 'hpkv endpoint status {name} -n {namespace}'; model downloads "
                        "can take long: raise --timeout",
                    )
                time.sleep(min(poll_interval(10.0), max(0.0, deadline - time.monotonic())))

    # --- delete ---------------------------------------------------------------------------------
    def plan_delete(self, name: str, namespace: str) -> Plan:
        from hpkv.kube import objects

        self.require_crd()
        plan = Plan(stage=STAGE)
        action = objects.plan_delete(
            self.ctx.kube,
            INFERENCE_API_VERSION,
            ENDPOINT_KIND,
            name,
            namespace,
            summary="delete the endpoint (the operator removes its Deployment, Service, router "
            "and load balancer target)",
        )
        if action.verb is Verb.NONE:
            raise NotFound(
                f"endpoint {namespace}/{name} does not exist",
                fix="check the name and -n NAMESPACE ('hpkv endpoint list' shows them all)",
            )
        plan.add(action)
        return plan

    def delete(self, plan: Plan) -> ApplyResult:
        result = self.run_plan(plan)
        if self.ctx.options.wait is True:
            for action in result.performed:
                self._wait_gone(*_ref(action))
        return result

    def _wait_gone(self, name: str, namespace: str) -> None:
        deadline = time.monotonic() + self.ctx.options.timeout
        with self.ctx.reporter.waiting(f"waiting for endpoint {namespace}/{name} to be deleted"):
            while self.read(name, namespace) is not None:
                if time.monotonic() >= deadline:
                    raise WaitTimeout(
                        f"endpoint {namespace}/{name} still exists after "
                        f"{int(self.ctx.options.timeout)}s",
                        fix="the operator's finalizer is still cleaning up; check its logs",
                    )
                time.sleep(min(poll_interval(5.0), max(0.0, deadline - time.monotonic())))

    # --- list and status ------------------------------------------------------------------------
    def summaries(self, namespace: str | None) -> list[dict[str, Any]]:
        from hpkv.kube import kube_errors

        self.require_crd()
        resource = self.ctx.kube.resource(INFERENCE_API_VERSION, ENDPOINT_KIND)
        with kube_errors("list InferenceEndpointConfigs"):
            items = (resource.get(namespace=namespace) if namespace else resource.get()).items
        rows = []
        for item in items:
            obj = item.to_dict()
            spec, status = obj.get("spec") or {}, obj.get("status") or {}
            deployment = (status.get("deploymentStatus") or {}).get("status") or {}
            rows.append(
                {
                    "namespace": obj["metadata"]["namespace"],
                    "name": obj["metadata"]["name"],
                    "model": spec.get("modelName"),
                    "state": status.get("state"),
                    "ready": f"{deployment.get('readyReplicas') or 0}/{spec.get('replicas', 1)}",
                    "routing": (spec.get("intelligentRoutingSpec") or {}).get("routingStrategy")
                    if routing_enabled(obj)
                    else None,
                }
            )
        return sorted(rows, key=lambda r: (r["namespace"], r["name"]))

    def report(self, name: str, namespace: str) -> EndpointStatus:
        self.require_crd()
        live = self.read(name, namespace)
        report = EndpointStatus(name=name, namespace=namespace, found=live is not None)
        if live is None:
            report.checks.append(
                self.check(
                    "endpoint",
                    CheckState.FAIL,
                    f"{namespace}/{name} not found",
                    "deploy it with 'hpkv endpoint deploy NAME'",
                )
            )
            return report
        spec, status = live.get("spec") or {}, live.get("status") or {}
        report.state = status.get("state")
        report.conditions = list(status.get("conditions") or [])
        report.deployment = dict(status.get("deploymentStatus") or {})
        report.checks.append(self._state_check(report.state, live))
        report.pods = self._pods(name, namespace)
        report.checks.append(self._replica_check(spec, report))
        if routing_enabled(live):
            report.routing_service = self._routing_service(name, namespace)
            report.checks.append(self._routing_check(name, namespace, report.routing_service))
        report.load_balancer = self._load_balancer(live)
        report.checks.append(
            self.check("load-balancer", CheckState.OK, report.load_balancer)
            if report.load_balancer
            else self.check(
                "load-balancer",
                CheckState.WARN,
                f"no hostname yet (no {REGISTRATION_KIND} for {namespace}/{name} reports one)",
                "wait for the operator to register the endpoint",
            )
        )
        return report

    def _state_check(self, state: str | None, live: dict[str, Any]) -> Check:
        if state == COMPLETE:
            return self.check("state", CheckState.OK, state)
        if state == FAILED:
            return self.check(
                "state",
                CheckState.FAIL,
                f"{state}: {_deployment_message(live)}",
                f"see the operator logs: kubectl logs -n {OPERATOR_NAMESPACE} "
                "deploy/hyperpod-inference-controller-manager",
            )
        if state is None:
            return self.check(
                "state",
                CheckState.WARN,
                "no status yet",
                "check that the operator runs ('hpkv operator status')",
            )
        return self.check("state", CheckState.WARN, state, "wait; the operator is working on it")

    def _replica_check(self, spec: dict[str, Any], report: EndpointStatus) -> Check:
        desired = int(spec.get("replicas") or 1)
        counts = report.deployment.get("status") or {}
        ready = int(counts.get("readyReplicas") or 0)
        available = int(counts.get("availableReplicas") or 0)
        pods_ready = sum(1 for p in report.pods if p["ready"])
        evidence = (
            f"{ready}/{desired} ready, {available} available; pods ready {pods_ready}/"
            f"{len(report.pods)}"
        )
        if ready >= desired and desired > 0:
            return self.check("replicas", CheckState.OK, evidence)
        return self.check(
            "replicas",
            CheckState.FAIL if ready == 0 and report.state == COMPLETE else CheckState.WARN,
            evidence,
            f"kubectl get pods -n {report.namespace} -l {WORKER_LABEL}={report.name}",
        )

    def _pods(self, name: str, namespace: str) -> list[dict[str, Any]]:
        from hpkv.kube import kube_errors

        with kube_errors(f"list the pods of endpoint {namespace}/{name}"):
            pods = self.ctx.kube.core.list_namespaced_pod(
                namespace, label_selector=f"{WORKER_LABEL}={name}"
            ).items
        rows = []
        for pod in sorted(pods, key=lambda p: p.metadata.name):
            statuses = (pod.status.container_statuses or []) if pod.status else []
            rows.append(
                {
                    "name": pod.metadata.name,
                    "node": pod.spec.node_name if pod.spec else None,
                    "phase": pod.status.phase if pod.status else None,
                    "ready": bool(statuses) and all(s.ready for s in statuses),
                    "containers": f"{sum(1 for s in statuses if s.ready)}/{len(statuses)}",
                    "restarts": sum(s.restart_count or 0 for s in statuses),
                }
            )
        return rows

    def _routing_service(self, name: str, namespace: str) -> dict[str, Any] | None:
        from hpkv.kube import is_status, kube_errors

        service_name = routing_service(name)
        with kube_errors(f"read Service {namespace}/{service_name}"):
            try:
                service = self.ctx.kube.core.read_namespaced_service(service_name, namespace)
            except Exception as exc:
                if is_status(exc, 404):
                    return None
                raise
            routers = self.ctx.kube.core.list_namespaced_pod(
                OPERATOR_NAMESPACE, label_selector=router_selector(name, namespace)
            ).items
        ports = [f"{p.port}/{p.protocol or 'TCP'}" for p in service.spec.ports or []]
        return {
            "name": service_name,
            "type": service.spec.type,
            "clusterIP": service.spec.cluster_ip,
            "ports": ports,
            "url": f"http://{service_name}.{namespace}.svc:{(service.spec.ports or [None])[0].port}"
            if service.spec.ports
            else None,
            "routerPods": [p.metadata.name for p in routers],
        }

    def _routing_check(self, name: str, namespace: str, service: dict[str, Any] | None) -> Check:
        if service is None:
            return self.check(
                "routing-service",
                CheckState.WARN,
                f"Service {namespace}/{routing_service(name)} not found yet",
                "wait for the operator to create the router",
            )
        return self.check(
            "routing-service",
            CheckState.OK,
            f"{service['name']} {service['type']} {service['clusterIP']} "
            f"{','.join(service['ports'])} (plain HTTP: {service['url']})",
        )

    def _load_balancer(self, live: dict[str, Any]) -> str | None:
        from hpkv.kube import kube_errors

        meta = live["metadata"]
        try:
            resource = self.ctx.kube.resource(INFERENCE_API_VERSION, REGISTRATION_KIND)
        except NotFound:
            return None
        with kube_errors(f"list {REGISTRATION_KIND}s in {meta['namespace']}"):
            items = [i.to_dict() for i in resource.get(namespace=meta["namespace"]).items]
        endpoint_name = (live.get("spec") or {}).get("endpointName")
        uid = meta.get("uid")
        for item in items:
            owners = {o.get("uid") for o in item["metadata"].get("ownerReferences") or []}
            spec = item.get("spec") or {}
            if (
                (uid and uid in owners)
                or item["metadata"]["name"] == meta["name"]
                or (endpoint_name and spec.get("name") == endpoint_name)
            ):
                status = item.get("status") or {}
                return (status.get("loadBalancer") or {}).get("hostName") or spec.get(
                    "loadBalancerHostName"
                )
        return None


def _ref(action: Action) -> tuple[str, str]:
    """(name, namespace) of an action on ``InferenceEndpointConfig/<namespace>/<name>``."""
    _, namespace, name = action.target.split("/", 2)
    return name, namespace


def _deployment_message(live: dict[str, Any] | None) -> str:
    status = (live or {}).get("status") or {}
    deployment = status.get("deploymentStatus") or {}
    parts = [deployment.get("reason"), deployment.get("message")]
    for condition in status.get("conditions") or []:
        if condition.get("status") == "False" and condition.get("message"):
            parts.append(f"{condition.get('type')}: {condition['message']}")
    return "; ".join(p for p in parts if p) or "no reason reported"
