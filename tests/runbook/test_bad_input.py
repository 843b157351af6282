"""Bad input: a corpus of malformed flags, hpkv.yaml files, environment variables, kubeconfigs,
cluster profiles, unknown contexts and clusters, region typos and broken credentials. Each ends
with exit code 1 or 2 and one line `hpkv: error: <cause>. Fix: <fix>` naming the input, never a
traceback, and none changes anything (zero mutating AWS and Kubernetes calls)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpkv.stages import stage_class, stage_names
from tests.harness.aws import AwsEmulator, Fault
from tests.harness.kube import KubeHarness
from tests.harness.runbook import COUNTS
from tests.harness.scenario import Scenario

pytestmark = [pytest.mark.kube, pytest.mark.aws]


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    expect: str  # a fragment of the error line: the input it names
    code: int = 2
    files: tuple[tuple[str, str | bytes], ...] = ()  # relative path -> content ({server} etc.)
    env: tuple[tuple[str, str], ...] = ()
    unset: tuple[str, ...] = ()
    faults: tuple[Fault, ...] = ()
    setup: str = ""  # a SETUPS key
    progress: bool = False  # progress lines may precede the error (it happens mid-run)


UP = ("up", "--cluster", "demo", "--yes")
DRY = ("up", "--cluster", "demo", "--dry-run")
OFFLINE = ("up", "--offline", "--dry-run", "--cluster-profile", "profile.yaml")


def _flags() -> list[Case]:
    cases = [
        Case("up-unknown-option", ("up", "--bogus"), "No such option: --bogus"),
        Case("down-unknown-option", ("down", "--bogus"), "No such option: --bogus"),
        Case("init-unknown-option", ("init", "--bogus"), "No such option: --bogus"),
        Case("up-from-unknown", ("up", "--from", "nope"), "'nope' is not one of"),
        Case("up-through-unknown", ("up", "--through", "nope"), "'nope' is not one of"),
        Case("down-from-unknown", ("down", "--from", "nope"), "'nope' is not one of"),
        Case("down-through-unknown", ("down", "--through", "l3"), "'l3' is not one of"),
        Case("up-from-no-value", ("up", "--from"), "'--from' requires an argument"),
        Case("up-extra-argument", ("up", "extra"), "unexpected extra argument(s) (extra)"),
        Case("down-extra-argument", ("down", "now"), "unexpected extra argument(s) (now)"),
        Case("init-extra-argument", ("init", "demo"), "unexpected extra argument(s) (demo)"),
        Case("up-offline-without-dry-run", ("up", "--offline"), "--offline only plans"),
        Case(
            "up-cluster-profile-without-offline",
            ("up", "--cluster-profile", "p.yaml"),
            "--cluster-profile is only used with --offline",
        ),
        Case("up-output-xml", ("up", "-o", "xml"), "'xml' is not one of"),
        Case("up-output-no-value", ("up", "--output"), "'--output' requires an argument"),
        Case("up-timeout-word", (*UP, "--timeout", "abc"), "--timeout is 'abc'"),
        Case("up-timeout-zero", (*UP, "--timeout", "0"), "duration '0' must be positive"),
        Case("up-timeout-negative", (*UP, "--timeout=-5"), "--timeout is '-5'"),
        Case("up-timeout-unit", (*UP, "--timeout", "5x"), "--timeout is '5x'"),
        Case("up-region-missing-hyphen", (*UP, "--region", "us-west2"), "did you mean 'us-west-2'"),
        Case("up-region-upper-case", (*UP, "--region", "US-WEST-2"), "--region is 'US-WEST-2'"),
        Case("up-region-underscores", (*UP, "--region", "us_west_2"), "--region is 'us_west_2'"),
        Case("up-region-letters-swapped", (*UP, "--region", "us-wset-2"), "region 'us-wset-2'"),
        Case("up-region-no-such-number", (*UP, "--region", "eu-west-9"), "region 'eu-west-9'"),
        Case("up-region-no-hyphens", (*UP, "--region", "useast1"), "--region is 'useast1'"),
        Case("up-region-empty", (*UP, "--region", ""), "--region is ''"),
        Case("up-cluster-invalid-name", ("up", "--cluster", "bad name!"), "'bad name!'"),
        Case("up-cluster-empty", ("up", "--cluster", ""), "--cluster is ''"),
        Case("up-cluster-too-long", ("up", "--cluster", "c" * 64), "--cluster is 'ccc"),
        Case("up-cluster-unknown", ("up", "--cluster", "nope", "--yes"), "'nope' not found", 1),
        Case("down-cluster-unknown", ("down", "--cluster", "nope"), "'nope' not found", 1),
        Case("init-cluster-unknown", ("init", "--cluster", "nope"), "'nope' not found", 1),
        Case("up-no-cluster", ("up", "--yes"), "no HyperPod cluster given"),
        Case("down-no-cluster", ("down", "--yes"), "no HyperPod cluster given"),
        Case("up-profile-unknown", (*UP, "--profile", "nope"), "AWS profile 'nope'"),
        Case("init-profile-unknown", ("init", "--profile", "nope"), "AWS profile 'nope'"),
        Case("up-config-missing", (*UP, "--config", "missing.yaml"), "missing.yaml does not exist"),
        Case("up-config-directory", (*UP, "--config", "adir"), "adir is a directory"),
        Case(
            "init-config-inside-a-file",
            ("init", "--config", "afile/hpkv.yaml"),
            "cannot write afile/hpkv.yaml",
            files=(("afile", "x"),),
        ),
        Case("up-kubeconfig-missing", (*UP, "--kubeconfig", "nokc"), "kubeconfig nokc does not"),
        Case("up-kubeconfig-directory", (*UP, "--kubeconfig", "adir"), "adir is a directory"),
        Case("up-context-unknown", (*UP, "--context", "nope"), "context 'nope' is not in", 1),
        Case("down-context-unknown", ("down", "--cluster", "demo", "--context", "x"), "'x'", 1),
        Case("down-delete-data-value", ("down", "--delete-data=yes"), "--delete-data"),
        Case("down-delete-volumes-value", ("down", "--delete-volumes=1"), "--delete-volumes"),
        Case("down-delete-iam-value", ("down", "--delete-iam=no"), "--delete-iam"),
        Case(
            "curvine-remove-delete-volumes-value",
            ("curvine", "remove", "--delete-volumes=yes"),
            "--delete-volumes",
        ),
    ]
    optional = [n for n in stage_names() if stage_class(n).optional]
    if not optional:
        cases.append(Case("up-bench-without-stage", (*UP, "--bench"), "--bench: this hpkv has no"))
    else:
        last_required = [n for n in stage_names() if not stage_class(n).optional][-1]
        cases += [
            Case(
                "up-bench-outside-range",
                (*UP, "--bench", "--through", last_required),
                "--bench is outside --from/--through",
            ),
            Case(
                "down-only-the-benchmark",
                ("down", "--cluster", "demo", "--from", optional[0], "--yes"),
                f"stage {optional[0]} has nothing to remove",
            ),
        ]
    if len(stage_names()) > 1:
        first, last = stage_names()[0], stage_names()[-1]
        cases.append(
            Case(
                "up-range-reversed",
                (*UP, "--from", last, "--through", first),
                f"--from {last} comes after --through {first}",
            )
        )
    return cases


def _profiles() -> list[Case]:
    def case(name: str, text: str | bytes, expect: str) -> Case:
        return Case(f"profile-{name}", OFFLINE, expect, files=(("profile.yaml", text),))

    return [
        Case("profile-missing", OFFLINE, "cluster profile profile.yaml does not exist"),
        case("yaml-syntax", "name: [x\n", "profile.yaml is not valid YAML at line"),
        case("a-list", "- name: x\n", "must be a YAML mapping, found list"),
        case("unknown-key", "name: x\nnmae: y\n", "'nmae' was unexpected"),
        case(
            "count-word",
            "name: x\ninstanceGroups: [{instanceType: ml.g5.xlarge, count: two}]\n",
            "instanceGroups.0.count is 'two'",
        ),
        case(
            "instance-type-without-ml",
            "name: x\ninstanceGroups: [{instanceType: g6e.4xlarge, count: 1}]\n",
            "instanceType is 'g6e.4xlarge'",
        ),
        case("name-invalid", "name: bad name\n", "name is 'bad name'"),
        case("missing-name", "region: us-west-2\n", "'name' is a required property"),
        case("eks-version-number", "name: x\neks: {version: 1}\n", "eks.version is 1"),
        case("tiered-mode", "name: x\ntieredStorage: {Mode: Enabled}\n", "Mode is 'Enabled'"),
        case("region-typo", "name: x\nregion: us-west2\n", "region is 'us-west2'"),
        case("node-recovery", "name: x\nnodeRecovery: Manual\n", "nodeRecovery is 'Manual'"),
        case("not-utf8", b"\xff\xfe\x00name", "cannot read cluster profile profile.yaml"),
        case(
            "endpoint-name-invalid",
            "name: x\nendpoints: [{name: Bad Name}]\n",
            "endpoints.0.name is 'Bad Name'",
        ),
        case(
            "endpoint-replicas-zero",
            "name: x\nendpoints: [{name: llama, replicas: 0}]\n",
            "endpoints.0.replicas is 0",
        ),
        case(
            "endpoint-unknown-key",
            "name: x\nendpoints: [{name: llama, replica: 2}]\n",
            "'replica' was unexpected",
        ),
        case("endpoints-not-a-list", "name: x\nendpoints: llama\n", "endpoints is 'llama'"),
        Case(
            "profile-no-gpu-group",
            OFFLINE,
            "the cluster profile has no GPU instance group",
            1,
            files=(
                (
                    "profile.yaml",
                    "name: x\ninstanceGroups: [{instanceType: ml.m5.xlarge, count: 2}]\n",
                ),
            ),
        ),
    ]


def _config_files() -> list[Case]:
    def case(name: str, text: str | bytes, expect: str, code: int = 2) -> Case:
        return Case(f"hpkv-yaml-{name}", DRY, expect, code, files=(("hpkv.yaml", text),))

    return [
        case("cluster-number", "cluster: 123\n", "cluster is 123, expected string"),
        case("cluster-list", "cluster: [a, b]\n", "cluster is list, expected string"),
        case("cluster-invalid", "cluster: 'bad name'\n", "cluster is 'bad name'"),
        case("region-number", "region: 5\n", "region is 5, expected string"),
        case("region-typo", "region: us-west2\n", "did you mean 'us-west-2'"),
        case("region-upper", "region: US-WEST-2\n", "region is 'US-WEST-2'"),
        case("region-unknown", "region: us-wset-2\n", "unknown AWS region 'us-wset-2'"),
        case("profile-mapping", "profile: {}\n", "profile is dict, expected string"),
        case("profile-empty", "profile: ''\n", "profile is ''"),
        case("profile-unknown", "profile: nope\n", "AWS profile 'nope'"),
        case("kubeconfig-number", "kubeconfig: 5\n", "kubeconfig is 5"),
        case("kubeconfig-empty", "kubeconfig: ''\n", "kubeconfig is ''"),
        case("kubeconfig-missing", "kubeconfig: /nonexistent/kc\n", "/nonexistent/kc does not"),
        case("context-bool", "context: true\n", "context is True, expected string"),
        case("context-empty", "context: ''\n", "context is ''"),
        case("context-unknown", "context: nope\n", "context 'nope' is not in kubeconfig", 1),
        case("output-xml", "output: xml\n", "output is 'xml', expected one of table, json"),
        case("output-number", "output: 1\n", "output is 1"),
        case("timeout-word", "timeout: abc\n", "timeout is 'abc'"),
        case("timeout-negative", "timeout: -1\n", "duration '-1' must be positive"),
        case("timeout-list", "timeout: [1]\n", "timeout is list"),
        case("timeout-zero", "timeout: '0'\n", "duration '0' must be positive"),
        case("helm-empty", "helm: ''\n", "helm is ''"),
        case("helm-number", "helm: 3\n", "helm is 3"),
        case("section-string", "tieredStorage: x\n", "tieredStorage is 'x', expected object"),
        case("section-list", "tieredStorage: []\n", "tieredStorage is list, expected object"),
        case(
            "percent-word",
            "tieredStorage:\n  memoryPercent: twenty\n",
            "tieredStorage.memoryPercent is 'twenty', expected integer",
        ),
        case("percent-low", "tieredStorage:\n  memoryPercent: 10\n", "valid range 20..100"),
        case("percent-high", "tieredStorage:\n  memoryPercent: 101\n", "is 101, outside"),
        case("percent-fraction", "tieredStorage:\n  memoryPercent: 20.5\n", "is 20.5, expected"),
        case("percent-null", "tieredStorage:\n  memoryPercent:\n", "is None, expected integer"),
        case("percent-bool", "tieredStorage:\n  memoryPercent: true\n", "is True, expected"),
        case("nested-unknown-key", "tieredStorage:\n  memPercent: 20\n", "memPercent"),
        case("section-case", "tieredstorage: {}\n", "did you mean 'tieredStorage'"),
        case("key-typo-cluster", "clster: demo\n", "did you mean 'cluster'"),
        case("key-typo-region", "regoin: us-west-2\n", "did you mean 'region'"),
        case("unknown-key", "foo: bar\n", "unknown key 'foo'"),
        case(
            "sizing-replicas-zero", "sizing:\n  replicas: 0\n", "replicas is 0, below the minimum 1"
        ),
        case("sizing-replicas-string", "sizing:\n  replicas: '2'\n", "sizing.replicas is '2'"),
        case("sizing-tp-negative", "sizing:\n  tp: -1\n", "sizing.tp is -1"),
        case("sizing-model-empty", "sizing:\n  model: ''\n", "sizing.model is ''"),
        case("sizing-unknown-key", "sizing:\n  bogus: 1\n", "unknown key 'sizing.bogus'"),
        case("yaml-unclosed-bracket", "cluster: [unclosed\n", "is not valid YAML at line"),
        case("yaml-unclosed-quote", "cluster: 'unclosed\n", "is not valid YAML at line"),
        case("yaml-tab-indent", "\tcluster: demo\n", "is not valid YAML at line 1"),
        case("yaml-double-colon", "a: b: c\n", "is not valid YAML at line 1"),
        case("yaml-bad-indent", "cluster: demo\n  region: x\n", "is not valid YAML at line 2"),
        case("yaml-list-then-map", "- a\nb: c\n", "is not valid YAML at line 2"),
        case("yaml-reserved-char", "cluster: @demo\n", "is not valid YAML at line 1"),
        case("yaml-open-brace", "{\n", "is not valid YAML"),
        case("yaml-two-documents", "cluster: demo\n---\nregion: x\n", "is not valid YAML"),
        case("yaml-undefined-alias", "cluster: *alias\n", "is not valid YAML"),
        case("yaml-python-tag", "cluster: !!python/name:os.system x\n", "is not valid YAML"),
        case("not-a-mapping-string", "just a string\n", "must be a YAML mapping, found str"),
        case("not-a-mapping-list", "[1, 2]\n", "must be a YAML mapping, found list"),
        case("not-a-mapping-number", "42\n", "must be a YAML mapping, found int"),
        case("not-utf8", b"\xff\xfe\x00cluster", "is not UTF-8 text"),
        *_stage_config_files(),
    ]


def _stage_config_files() -> list[Case]:
    """Stages 2-4: malformed values of their sections (rejected when hpkv.yaml is read), and
    values only planning can judge (after the stages before them were planned)."""

    def case(name: str, text: str, expect: str, code: int = 2, progress: bool = False) -> Case:
        return Case(
            f"hpkv-yaml-{name}", DRY, expect, code, files=(("hpkv.yaml", text),), progress=progress
        )

    return [
        case(
            "operator-version-not-a-version",
            "operator:\n  versions:\n    certManager: 1.x.y\n",
            "operator.versions.certManager is '1.x.y'",
        ),
        case(
            "operator-version-key-case",
            "operator:\n  versions:\n    certmanager: default\n",
            "did you mean 'operator.versions.certManager'",
        ),
        case(
            "operator-unknown-addon",
            "operator:\n  versions:\n    kueue: latest\n",
            "unknown key 'operator.versions.kueue'",
        ),
        case(
            "operator-role-empty",
            "operator:\n  roles:\n    execution: ''\n",
            "operator.roles.execution is ''",
        ),
        case(
            "operator-unknown-role",
            "operator:\n  roles:\n    sagemaker: MyRole\n",
            "unknown key 'operator.roles.sagemaker'",
        ),
        case(
            "operator-tls-bucket-invalid",
            "operator:\n  tlsBucket: Bad_Bucket\n",
            "operator.tlsBucket is 'Bad_Bucket'",
        ),
        case(
            "operator-alb-policy-not-an-arn",
            "operator:\n  albPolicyArn: AWSLoadBalancerControllerIAMPolicy\n",
            "operator.albPolicyArn is 'AWSLoadBalancerControllerIAMPolicy'",
        ),
        case(
            "operator-resolve-conflicts",
            "operator:\n  resolveConflicts: KEEP\n",
            "expected one of OVERWRITE, PRESERVE, NONE",
        ),
        case(
            "operator-model-buckets-string",
            "operator:\n  modelBuckets: models\n",
            "operator.modelBuckets is 'models', expected array",
        ),
        case("operator-section-list", "operator: []\n", "operator is list, expected object"),
        case(
            "operator-execution-role-prefix",
            "operator:\n  roles:\n    execution: MyRole\n",
            "role 'MyRole' does not start with SageMakerHyperPodInference",
            progress=True,
        ),
        case(
            "operator-given-role-missing",
            "operator:\n  roles:\n    alb: NoSuchRole\n",
            "role NoSuchRole (operator.roles.alb) does not exist",
            1,
            progress=True,
        ),
        case(
            "operator-alb-policy-missing",
            "operator:\n  albPolicyArn: arn:aws:iam::123456789012:policy/NoSuchPolicy\n",
            "IAM policy arn:aws:iam::123456789012:policy/NoSuchPolicy for the ALB controller role "
            "does not exist",
            1,
            progress=True,
        ),
        case(
            "operator-version-unavailable",
            "operator:\n  versions:\n    certManager: v9.9.9\n",
            "operator.versions.certManager: cert-manager v9.9.9 is not available",
            progress=True,
        ),
        case(
            "curvine-master-replicas-even",
            "curvine:\n  masterReplicas: 2\n",
            "curvine.masterReplicas is 2, expected one of 1, 3, 5, 7",
        ),
        case(
            "curvine-chart-version-word",
            "curvine:\n  chartVersion: latest\n",
            "curvine.chartVersion is 'latest'",
        ),
        case(
            "curvine-capacity-reserve",
            "curvine:\n  capacityReserve: lots\n",
            "curvine.capacityReserve is 'lots'",
        ),
        case(
            "curvine-pvc-size",
            "curvine:\n  pvcSize: 100 GB\n",
            "curvine.pvcSize is '100 GB'",
        ),
        case(
            "curvine-pvc-namespace-invalid",
            "curvine:\n  pvcNamespaces: [Team A]\n",
            "curvine.pvcNamespaces.0 is 'Team A', which is not a valid pvcNamespaces entry",
        ),
        case(
            "curvine-data-dir-relative",
            "curvine:\n  dataDir: curvine-data\n",
            "curvine.dataDir is 'curvine-data'",
        ),
        case(
            "curvine-ttl-word",
            "curvine:\n  eviction:\n    ttl: forever\n",
            "curvine.eviction.ttl is 'forever'",
        ),
        case(
            "curvine-watermark-above-one",
            "curvine:\n  eviction:\n    highWatermark: 1.5\n",
            "curvine.eviction.highWatermark is 1.5",
        ),
        case(
            "curvine-addon-version",
            "curvine:\n  ebsCsi:\n    addonVersion: newest\n",
            "curvine.ebsCsi.addonVersion is 'newest'",
        ),
        case(
            "curvine-watermarks-inverted",
            "curvine:\n  eviction:\n    lowWatermark: 0.9\n",
            "curvine.eviction.lowWatermark (0.9) must be below highWatermark (0.8)",
            progress=True,
        ),
        case(
            "curvine-format-flag-in-extra-values",
            "curvine:\n  extraValues:\n    cluster:\n      formatMaster: true\n",
            "curvine.extraValues sets cluster.format*: those flags delete Curvine data",
            progress=True,
        ),
        case("l2-mode-unknown", "l2:\n  mode: sidecar\n", "l2.mode is 'sidecar'"),
        case(
            "l2-mechanism-unknown",
            "l2:\n  mechanism: webhook\n",
            "l2.mechanism is 'webhook', expected one of auto, admission-policy, kyverno",
        ),
        case("l2-mount-path-relative", "l2:\n  mountPath: mnt/l2\n", "l2.mountPath is 'mnt/l2'"),
        case("l2-mount-path-comma", "l2:\n  mountPath: /mnt/a,b\n", "l2.mountPath is '/mnt/a,b'"),
        case("l2-volume-name-upper", "l2:\n  volumeName: Cache\n", "l2.volumeName is 'Cache'"),
        case(
            "l2-hash-seed-negative",
            "l2:\n  pythonHashSeed: -1\n",
            "l2.pythonHashSeed is -1, outside the valid range 0..4294967295",
        ),
        case("l2-restart-unknown", "l2:\n  restart: always\n", "l2.restart is 'always'"),
        case(
            "l2-failure-policy",
            "l2:\n  failurePolicy: ignore\n",
            "l2.failurePolicy is 'ignore', expected one of Ignore, Fail",
        ),
        case(
            "l2-install-kyverno-word",
            "l2:\n  installKyverno: maybe\n",
            "l2.installKyverno is 'maybe', expected boolean",
        ),
        case(
            "l2-kyverno-unknown-key",
            "l2:\n  kyverno:\n    version: 3.7.2\n",
            "unknown key 'l2.kyverno.version'",
        ),
        case("bench-results-dir-empty", "bench:\n  resultsDir: ''\n", "bench.resultsDir is ''"),
    ]


def _environment() -> list[Case]:
    def case(name: str, var: str, value: str, expect: str, args: tuple[str, ...] = DRY) -> Case:
        return Case(f"env-{name}", args, expect, env=((var, value),))

    memory = "HPKV_TIERED_STORAGE__MEMORY_PERCENT"
    return [
        case("percent-word", memory, "abc", f"{memory} is 'abc'"),
        case("percent-low", memory, "5", f"{memory} is 5, outside the valid range"),
        case("output", "HPKV_OUTPUT", "xml", "HPKV_OUTPUT is 'xml'"),
        case("timeout", "HPKV_TIMEOUT", "never", "HPKV_TIMEOUT is 'never'"),
        case("unknown-variable", "HPKV_BOGUS", "1", "unknown key 'HPKV_BOGUS'"),
        case("cluster-empty", "HPKV_CLUSTER", "", "HPKV_CLUSTER is ''", ("up", "--yes")),
        case("region-typo", "HPKV_REGION", "us-west2", "HPKV_REGION is 'us-west2'"),
        case("config-missing", "HPKV_CONFIG", "/nonexistent.yaml", "/nonexistent.yaml does not"),
        case("section-scalar", "HPKV_TIERED_STORAGE", "5", "HPKV_TIERED_STORAGE is 5"),
        case("sizing-word", "HPKV_SIZING__REPLICAS", "zero", "HPKV_SIZING__REPLICAS is 'zero'"),
        case("l2-mode", "HPKV_L2__MODE", "sidecar", "HPKV_L2__MODE is 'sidecar'"),
        case(
            "operator-resolve-conflicts",
            "HPKV_OPERATOR__RESOLVE_CONFLICTS",
            "keep",
            "HPKV_OPERATOR__RESOLVE_CONFLICTS is 'keep'",
        ),
        case(
            "curvine-master-replicas",
            "HPKV_CURVINE__MASTER_REPLICAS",
            "two",
            "HPKV_CURVINE__MASTER_REPLICAS is 'two'",
        ),
        case(
            "l2-install-kyverno",
            "HPKV_L2__INSTALL_KYVERNO",
            "maybe",
            "HPKV_L2__INSTALL_KYVERNO is 'maybe'",
        ),
        case("retry-mode", "HPKV_AWS_RETRY_MODE", "bogus", "HPKV_AWS_RETRY_MODE=bogus", UP),
        case("read-timeout-word", "HPKV_AWS_READ_TIMEOUT", "abc", "HPKV_AWS_READ_TIMEOUT=abc", UP),
        case("read-timeout-zero", "HPKV_AWS_READ_TIMEOUT", "0", "HPKV_AWS_READ_TIMEOUT=0", UP),
        case("max-attempts-word", "AWS_MAX_ATTEMPTS", "abc", "AWS_MAX_ATTEMPTS=abc", UP),
        case("max-attempts-zero", "AWS_MAX_ATTEMPTS", "0", "max_attempts is 0", UP),
        case("aws-profile-unknown", "AWS_PROFILE", "nope", "AWS profile 'nope'", UP),
        case("kubeconfig-missing", "KUBECONFIG", "/nonexistent/kc", "/nonexistent/kc", UP),
        case("kubeconfig-directory", "KUBECONFIG", "adir", "adir is a directory", UP),
        Case(
            "env-aws-region-typo",
            UP,
            "unknown AWS region 'us-wset-2'",
            env=(("AWS_REGION", "us-wset-2"), ("AWS_DEFAULT_REGION", "us-wset-2")),
        ),
    ]


KUBE_OK_CLUSTER = (
    "clusters: [{name: c, cluster: {server: '{server}', certificate-authority-data: {ca}}}]\n"
)


def _kubeconfig(
    name: str, body: str | bytes, expect: str, code: int = 1, context: str = "k"
) -> Case:
    args = (*UP, "--kubeconfig", "kc.yaml") + (("--context", context) if context else ())
    return Case(f"kubeconfig-{name}", args, expect, code, files=(("kc.yaml", body),))


def _kubeconfigs() -> list[Case]:
    ctx = "contexts: [{name: k, context: {cluster: c, user: u}}]\ncurrent-context: k\n"
    return [
        _kubeconfig("yaml-syntax", "clusters: [unclosed\n", "kc.yaml is not valid YAML", 2),
        _kubeconfig("a-list", "[1, 2]\n", "kc.yaml is not a kubeconfig mapping", 2),
        _kubeconfig("not-utf8", b"\xff\xfe\x00", "cannot read kubeconfig kc.yaml", 2),
        _kubeconfig("no-contexts", "apiVersion: v1\nkind: Config\n", "context 'k' is not in"),
        _kubeconfig(
            "context-without-cluster",
            "contexts: [{name: k, context: {cluster: gone, user: u}}]\nusers: [{name: u, user: {token: x}}]\n",
            "kubeconfig kc.yaml is unusable",
            2,
        ),
        _kubeconfig(
            "cluster-without-server",
            "clusters: [{name: c, cluster: {}}]\nusers: [{name: u, user: {token: x}}]\n" + ctx,
            "kubeconfig kc.yaml: context 'k' has no server URL",
            2,
        ),
        _kubeconfig(
            "wrong-token",
            KUBE_OK_CLUSTER + "users: [{name: u, user: {token: wrong}}]\n" + ctx,
            "rejected the credentials (401",
        ),
        _kubeconfig(
            "missing-user-is-anonymous",
            KUBE_OK_CLUSTER + ctx,
            "system:anonymous",
        ),
        _kubeconfig(
            "server-unreachable",
            "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n"
            "users: [{name: u, user: {token: x}}]\n" + ctx,
            "cannot reach the Kubernetes API",
        ),
        _kubeconfig(
            "bad-ca",
            "clusters: [{name: c, cluster: {server: '{server}', certificate-authority-data: "
            "bm90IGEgY2VydA==}}]\nusers: [{name: u, user: {token: '{token}'}}]\n" + ctx,
            "Kubernetes",
        ),
        _kubeconfig(
            "exec-plugin-missing",
            KUBE_OK_CLUSTER
            + "users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1beta1, "
            "command: /nonexistent/aws-iam-authenticator}}}]\n" + ctx,
            "runs /nonexistent/aws-iam-authenticator, which is not installed",
            2,
        ),
    ]


def _credentials_and_clusters() -> list[Case]:
    deny = Fault("sagemaker", "DescribeCluster", kind="deny", times=-1)
    return [
        Case("aws-no-credentials", UP, "no AWS credentials found", 1, unset=_KEYS),
        Case("aws-partial-credentials", UP, "no AWS credentials", 1, unset=_KEYS[1:]),
        Case("init-no-credentials", ("init",), "no AWS credentials found", 1, unset=_KEYS),
        Case(
            "aws-expired",
            UP,
            "AWS credentials have expired",
            1,
            faults=(Fault("sagemaker", kind="expired", times=-1),),
        ),
        Case(
            "init-expired",
            ("init",),
            "AWS credentials have expired",
            1,
            faults=(Fault("sts", kind="expired", times=-1),),
        ),
        Case("aws-denied-describe", UP, "AWS denied sagemaker:DescribeCluster", 1, faults=(deny,)),
        Case(
            "init-denied-list",
            ("init",),
            "AWS denied sagemaker:ListClusters",
            1,
            faults=(Fault("sagemaker", "ListClusters", kind="deny", times=-1),),
        ),
        Case(
            "aws-denied-eks",
            UP,
            "AWS denied eks:DescribeCluster",
            1,
            faults=(Fault("eks", "DescribeCluster", kind="deny", times=-1),),
        ),
        Case(
            "aws-denied-update",
            UP,
            "AWS denied sagemaker:UpdateCluster",
            1,
            faults=(Fault("sagemaker", "UpdateCluster", kind="deny", times=-1),),
            progress=True,
        ),
        Case(
            "aws-expired-on-update",
            UP,
            "AWS credentials have expired",
            1,
            faults=(Fault("sagemaker", "UpdateCluster", kind="expired", times=-1),),
            progress=True,
        ),
        Case(
            "down-denied-update",
            ("down", "--cluster", "demo", "--yes"),
            "AWS denied sagemaker:UpdateCluster",
            1,
            faults=(Fault("sagemaker", "UpdateCluster", kind="deny", times=-1),),
            setup="enabled",
            progress=True,
        ),
        Case(
            "cluster-not-eks",
            ("up", "--cluster", "plain", "--yes"),
            "'plain' is not orchestrated by EKS",
            1,
            setup="plain",
        ),
        Case(
            "init-cluster-not-eks",
            ("init", "--cluster", "plain"),
            "'plain' is not orchestrated by EKS",
            1,
            setup="plain",
        ),
        Case(
            "cluster-eks-missing",
            ("up", "--cluster", "orphan", "--yes"),
            "EKS cluster 'gone' not found",
            1,
            setup="orphan",
        ),
        Case(
            "cluster-failed",
            UP,
            "cluster 'demo' is Failed, not InService",
            1,
            setup="failed",
            progress=True,
        ),
        Case(
            "cluster-without-node-recovery",
            UP,
            "DescribeCluster reports no NodeRecovery for 'demo'",
            1,
            setup="no-node-recovery",
            progress=True,
        ),
        Case("init-no-clusters", ("init",), "no HyperPod clusters in us-west-2", 1, setup="empty"),
        Case(
            "init-two-clusters",
            ("init",),
            "2 HyperPod clusters in us-west-2 (demo, other)",
            setup="two",
        ),
        Case(
            "init-config-exists",
            ("init",),
            "hpkv.yaml already exists",
            files=(("hpkv.yaml", "cluster: demo\n"),),
        ),
        Case(
            "init-config-exists-yes",
            ("init", "--yes"),
            "pass --force to overwrite it",
            files=(("hpkv.yaml", "cluster: demo\n"),),
        ),
        Case("init-no-region", ("init",), "no AWS region configured", unset=_REGIONS),
        Case("up-no-region", UP, "no AWS region configured", unset=_REGIONS),
    ]


def _stages_and_endpoints() -> list[Case]:
    """Stage commands and ranges that need an earlier stage, and unknown endpoint names."""
    return [
        Case(
            "up-from-curvine-without-operator",
            (*UP, "--from", "curvine"),
            "planning stage curvine failed: it needs stage operator first",
            1,
            progress=True,
        ),
        Case(
            "up-only-l2-without-operator",
            (*UP, "--from", "l2", "--through", "l2"),
            "planning stage l2 failed: it needs stage operator first",
            1,
            progress=True,
        ),
        Case(
            "curvine-apply-without-operator",
            ("curvine", "apply", "--cluster", "demo", "--yes"),
            "list the namespaces in curvine.pvcNamespaces",
            1,
        ),
        Case(
            "l2-apply-without-operator",
            ("l2", "apply", "--cluster", "demo", "--yes"),
            "run stage 'operator' first",
            1,
        ),
        Case(
            "l2-apply-endpoint-unknown",
            ("l2", "apply", "--cluster", "demo", "--endpoint", "nope", "--yes"),
            "InferenceEndpointConfig 'nope' not found",
            1,
            setup="endpoint-crd",
        ),
        Case(
            "l2-remove-endpoint-unknown",
            ("l2", "remove", "--cluster", "demo", "--endpoint", "team-a/nope", "--yes"),
            "InferenceEndpointConfig 'team-a/nope' not found",
            1,
            setup="endpoint-crd",
        ),
        Case(
            "bench-run-endpoint-unknown",
            ("bench", "run", "--cluster", "demo", "--endpoint", "nope", "--yes"),
            "'nope'",
            1,
            setup="endpoint-crd",
        ),
        Case(
            "up-bench-without-operator",
            (*UP, "--from", "bench"),
            "planning stage bench failed: it needs stage operator first",
            1,
            progress=True,
        ),
    ]


_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
_REGIONS = ("AWS_REGION", "AWS_DEFAULT_REGION")


def _seed_plain(scenario: Scenario) -> None:
    scenario.sagemaker.seed_cluster("plain", eks_cluster_name=None)


def _seed_orphan(scenario: Scenario) -> None:
    scenario.sagemaker.seed_cluster("orphan", eks_cluster_name="gone")


def _seed_two(scenario: Scenario) -> None:
    scenario.sagemaker.seed_cluster("other")


def _seed_failed(scenario: Scenario) -> None:
    cluster = scenario.sagemaker.clusters["demo"]
    cluster.status = cluster.next_status = "Failed"


def _seed_no_node_recovery(scenario: Scenario) -> None:
    scenario.sagemaker.clusters["demo"].node_recovery = None


def _seed_enabled(scenario: Scenario) -> None:
    scenario.sagemaker.clusters["demo"].tiered_storage = {
        "Mode": "Enable",
        "InstanceMemoryAllocationPercentage": 20,
    }


def _seed_empty(scenario: Scenario) -> None:
    scenario.sagemaker.clusters.clear()


def _endpoint_crd(scenario: Scenario) -> Callable[[], None]:
    """The operator's InferenceEndpointConfig API, with no endpoint; removed after the case (the
    bad-input cluster is shared)."""
    from tests.harness.workloads import install_endpoint_crd

    kube = scenario.kube
    install_endpoint_crd(kube, scenario.shared_dir)
    name = "inferenceendpointconfigs.inference.sagemaker.aws.amazon.com"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name},
    }

    def remove() -> None:
        kube.delete_object(crd)
        kube.wait_until(
            lambda: kube.get_object(crd["apiVersion"], crd["kind"], name) is None,
            timeout=30,
            what=f"CRD {name} to be deleted",
        )
        kube._resources = None

    return remove


SETUPS: dict[str, Callable[[Scenario], Callable[[], None] | None]] = {
    "plain": _seed_plain,
    "orphan": _seed_orphan,
    "two": _seed_two,
    "failed": _seed_failed,
    "no-node-recovery": _seed_no_node_recovery,
    "enabled": _seed_enabled,
    "empty": _seed_empty,
    "endpoint-crd": _endpoint_crd,
}

CORPUS = _flags() + _profiles() + _config_files() + _environment() + _kubeconfigs()
CORPUS += _credentials_and_clusters() + _stages_and_endpoints()


def test_the_corpus_is_large_enough() -> None:
    assert len(CORPUS) >= 100
    assert len({c.id for c in CORPUS}) == len(CORPUS)


@pytest.fixture(scope="session")
def helm_path() -> str:
    """The harness's helm (resolved before a test isolates HOME)."""
    from tests.harness.binaries import harness_binary

    return str(harness_binary("helm"))


@pytest.fixture
def bad_input_cluster(
    helm_path: str,
    aws_env: AwsEmulator,
    kube_cluster: KubeHarness,
    isolated_env: Path,
    shared_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Scenario:
    """HyperPod cluster 'demo' on the shared apiserver (nothing is written to it, so no reset),
    with what planning each stage needs: the ALB controller's IAM policy (stage 2) and helm
    (stage 3's removal reads its releases)."""
    kubeconfig = kube_cluster.write_kubeconfig(isolated_env / "kubeconfig")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setenv("HPKV_HELM", helm_path)
    (isolated_env / "adir").mkdir()
    scenario = Scenario(aws=aws_env, kube=kube_cluster, workdir=isolated_env, kubeconfig=kubeconfig)
    scenario.shared_dir = shared_dir  # type: ignore[attr-defined]
    scenario.hyperpod(node_recovery="Automatic")
    aws_env.client("iam").create_policy(
        PolicyName="AWSLoadBalancerControllerIAMPolicy",
        PolicyDocument=json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {"Effect": "Allow", "Action": "elasticloadbalancing:*", "Resource": "*"}
                ],
            }
        ),
    )
    return scenario


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.id)
def test_bad_input_is_one_clear_line(
    bad_input_cluster: Scenario,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    case: Case,
) -> None:
    scenario = bad_input_cluster
    kube = scenario.kube
    for name, content in case.files:
        path = scenario.workdir / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            text = content.replace("{server}", kube.url).replace("{ca}", kube.ca_data())
            path.write_text(text.replace("{token}", kube.tokens["hpkv"]))
    for name, value in case.env:
        monkeypatch.setenv(name, value)
    for name in case.unset:
        monkeypatch.delenv(name, raising=False)
    cleanup = SETUPS[case.setup](scenario) if case.setup else None
    if cleanup is not None:
        request.addfinalizer(cleanup)
    for fault in case.faults:
        scenario.aws.inject(fault)
    mark = scenario.mark()

    result = scenario.hpkv(*case.args)
    COUNTS["inputs"] += 1

    assert result.exit_code == case.code, result
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("hpkv: error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], result.stderr
    if not case.progress:
        assert lines == errors, result.stderr
    line = errors[0]
    assert case.expect in line, line
    cause, _, fix = line.partition(". Fix: ")
    assert cause and fix.strip(), line
    assert "internal error" not in line
    assert _changes_since(scenario, mark) == []


def _changes_since(scenario: Scenario, mark: tuple[int, int]) -> list[str]:
    """Mutating calls that succeeded (a refused UpdateCluster attempt changes nothing)."""
    aws_mark, kube_mark = mark
    made = [str(c) for c in scenario.aws.writes_since(aws_mark) if c.status < 300]
    return made + [str(e) for e in scenario.kube.writes_since(kube_mark) if e.code < 300]
