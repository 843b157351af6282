"""Stage 5 in the runbook: ``hpkv up --bench`` runs the cross-pod benchmark against every inference
endpoint and saves each result. The benchmark itself is :mod:`hpkv.bench` (``hpkv bench run``);
this module only plugs it into ``hpkv up`` as an optional stage.

Each endpoint gets one run of the ``cross-pod`` scenario inside the cluster (a ConfigMap and a Job
that are deleted when the run ends) and a folder under ``bench.resultsDir`` with ``result.json``,
``report.md`` and the charts. A measurement is never "converged": every ``up --bench`` measures
again. ``hpkv down`` has nothing to remove here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpkv.bench import IAM_ACTIONS
from hpkv.errors import HpkvError
from hpkv.stages.base import Action, ApplyResult, Check, CheckState, Plan, PlanDeferred, Stage, Verb

if TYPE_CHECKING:
    from hpkv.bench.core import Bench, Prepared
    from hpkv.runbook.profile import ClusterProfile
    from hpkv.topology import EndpointRef

SCENARIOS = ["cross-pod"]

__all__ = ["IAM_ACTIONS", "BenchStage"]


class BenchStage(Stage):
    name = "bench"
    title = "Benchmark: cross-pod L2 hits, TTFT speedup and L2 read latency"
    number = 5
    optional = True

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self._outcomes: dict[str, Check] = {}

    # --- reads ---------------------------------------------------------------------------------
    def results_base(self) -> Path:
        return Path(self.ctx.settings.section("bench").get("resultsDir") or "hpkv-bench")

    def status(self) -> list[Check]:
        """The newest saved result (a local file; the benchmark changes nothing in the cluster)."""
        from hpkv.bench import results

        base = self.results_base()
        found = sorted(base.expanduser().glob("*/result.json"), key=lambda p: p.stat().st_mtime)
        if not found:
            return [
                self.check(
                    "latest-result",
                    CheckState.OK,
                    f"no benchmark result in {base} yet",
                    "run 'hpkv up --bench' or 'hpkv bench run --endpoint NAME'",
                )
            ]
        try:
            doc = results.load(found[-1])
        except HpkvError as exc:
            return [self.check("latest-result", CheckState.WARN, exc.one_line(), exc.fix or "")]
        return [self.check("latest-result", CheckState.OK, f"{found[-1]}: {_headline(doc)}")]

    def endpoints(self) -> list[EndpointRef]:
        from hpkv import topology

        if not topology.endpoint_api_served(self.ctx.kube):
            raise PlanDeferred(
                "operator",
                "it benchmarks InferenceEndpointConfigs, and that API (the operator's CRD) is not "
                "served yet",
            )
        return topology.list_endpoints(self.ctx.kube)

    # --- plan / apply --------------------------------------------------------------------------
    def _bench(self, ref: EndpointRef) -> Bench:
        from hpkv.bench.core import Bench, BenchOptions

        options = BenchOptions(
            scenarios=list(SCENARIOS), endpoint=ref.name, namespace=ref.namespace
        )
        return Bench(self.ctx, options)

    def plan(self, **_: Any) -> Plan:
        """One run per endpoint (reads only: finds the endpoint's ready pods and its image)."""
        plan = Plan(stage=self.name)
        refs = self.endpoints()
        if not refs:
            plan.notes.append("no InferenceEndpointConfigs: nothing to benchmark")
            return plan
        for ref in refs:
            bench = self._bench(ref)
            prepared = bench.prepare()
            created = bench.plan(prepared)
            plan.add(
                Action(
                    f"bench {ref}",
                    Verb.CREATE,
                    f"run the {', '.join(SCENARIOS)} scenario in the cluster ("
                    + ", ".join(a.target for a in created.actions)
                    + ", deleted when it ends); save result.json, report.md and charts under "
                    f"{bench.results_dir(prepared.run_id)}",
                    None,
                    {"runId": prepared.run_id, "pods": [p["name"] for p in prepared.pods]},
                    run=lambda ref=ref, bench=bench, prepared=prepared: self._run(
                        ref, bench, prepared
                    ),
                )
            )
        return plan

    def _run(self, ref: EndpointRef, bench: Bench, prepared: Prepared) -> None:
        from hpkv.bench.core import failed_scenarios, write_outputs

        result, failure = bench.run(prepared)
        if failure is not None and not result["scenarios"]:
            raise failure
        files = write_outputs(result, bench.results_dir(prepared.run_id))
        name = f"bench {ref}"
        failed = failed_scenarios(result)
        if failure is not None or failed:
            cause = failure.one_line() if failure is not None else "every request failed"
            self._outcomes[str(ref)] = self.check(
                name,
                CheckState.FAIL,
                f"{cause} (see {files['result']})",
                "check the endpoint's health ('hpkv status') and the first errors in the report",
            )
            return
        self._outcomes[str(ref)] = self.check(
            name, CheckState.OK, f"{_headline(result)}; result {files['result']}"
        )

    def apply(self, plan: Plan) -> ApplyResult:
        self._outcomes.clear()
        result = self.run_plan(plan)
        result.checks = list(self._outcomes.values())
        result.notes.extend(plan.notes)
        return result

    # --- offline -------------------------------------------------------------------------------
    def plan_offline(self, profile: ClusterProfile) -> Plan:
        plan = Plan(stage=self.name)
        for namespace, name, replicas in profile.endpoint_refs():
            plan.add(
                Action(
                    f"bench {namespace}/{name}",
                    Verb.CREATE,
                    f"run the {', '.join(SCENARIOS)} scenario in the cluster against 2 of its "
                    f"{replicas} pods (a ConfigMap and a Job, deleted when it ends); save "
                    f"result.json, report.md and charts under {self.results_base()}/<run id>",
                )
            )
        if not plan.actions:
            plan.notes.append("no inference endpoint in the profile: nothing to benchmark")
        return plan


def _headline(result: dict[str, Any]) -> str:
    """Cross-pod hit rate and TTFT speedup of the longest prompt, from a result document."""
    for doc in result.get("scenarios", []):
        rows = (doc.get("summary") or {}).get("byLength") or []
        if doc.get("name") != "cross-pod" or not rows:
            continue
        row = rows[-1]
        hit = row.get("hitRate")
        speedup = row.get("speedup")
        parts = [f"run {result.get('runId')}", f"{row.get('length')}-token prompts"]
        parts.append(f"cross-pod hit rate {hit:.0%}" if hit is not None else "no hit figures")
        if speedup is not None:
            parts.append(f"TTFT {speedup:.2f}x faster warm than cold")
        return ", ".join(parts)
    return f"run {result.get('runId')} (no cross-pod scenario)"
