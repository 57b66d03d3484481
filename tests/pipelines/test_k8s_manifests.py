"""The scale-out manifests (pipelines/k8s_manifests.py): valid Kubernetes objects for the cluster's
version, and the properties that only a live cluster would otherwise reveal.

Every object is validated offline against the Kubernetes API's own OpenAPI schemas
(kubernetes-validate, strict: unknown fields are errors) for the Kubernetes version the eks module
deploys. The rest is checked against the real counterparts: the labels dagster-k8s gives step pods
(built by dagster-k8s itself), the Pipes pod of the launcher, the sandbox service's own argument
parser and routes, and torchrun's own argument parser.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from configs import load_profile
from pipelines import k8s_manifests as km
from pipelines.k8s import job_pod_spec, step_config
from tests.conftest import CLUSTER_ENV
from tests.terraform_support import module

pytestmark = pytest.mark.scaleout

ROOT = Path(__file__).resolve().parents[2]


def cluster_profile(overrides: dict | None = None):
    with pytest.MonkeyPatch.context() as patch:
        for name, value in CLUSTER_ENV.items():
            patch.setenv(name, value)
        return load_profile("cluster", overrides or {})


def by_kind(manifests: list[dict], kind: str) -> dict:
    (found,) = [m for m in manifests if m["kind"] == kind]
    return found


def service_container(manifests: list[dict]) -> dict:
    (container,) = by_kind(manifests, "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def selects(selector: dict, labels: dict[str, str]) -> bool:
    """Kubernetes' label-selector rule (matchLabels and matchExpressions, ANDed)."""
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        present = key in labels
        if not {
            "In": present and labels[key] in values,
            "NotIn": not present or labels[key] not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[operator]:
            return False
    return True


def admitted(policy: dict, labels: dict[str, str], port: int) -> bool:
    """Whether the NetworkPolicy lets a pod of this namespace with `labels` reach `port`: a rule
    without `from` admits every source, a peer selects by pod labels (a namespaceSelector or an
    ipBlock would admit more than this namespace's pods, so they count as admitting everyone)."""
    for rule in policy["spec"].get("ingress", []):
        if rule.get("ports") and not any(p.get("port") == port for p in rule["ports"]):
            continue
        peers = rule.get("from") or [{}]
        for peer in peers:
            if set(peer) - {"podSelector"} or selects(peer.get("podSelector", {}), labels):
                return True
    return False


@pytest.fixture(scope="module")
def cfg():
    return cluster_profile()


@pytest.fixture(scope="module")
def manifests(cfg):
    return km.render_all(cfg, jobs=("sft", "rl_round"), nnodes=4)


@pytest.fixture(scope="module")
def kubernetes_version() -> str:
    return module("eks").default("kubernetes_version")


# --- Valid objects for the cluster's Kubernetes version ---------------------------------------------


@pytest.mark.parametrize("nnodes", [1, 4])
def test_every_manifest_validates_strictly_for_the_eks_version(cfg, kubernetes_version, nnodes):
    rendered = km.render_all(cfg, jobs=("sft",), nnodes=nnodes)
    assert {m["kind"] for m in rendered} == {
        "ServiceAccount",
        "ConfigMap",
        "Deployment",
        "Service",
        "NetworkPolicy",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "Job",
    }
    for manifest in rendered:
        # the schema of exactly that version, not an older one kubernetes-validate falls back to
        assert kubernetes_validate.validate(manifest, kubernetes_version, strict=True) == kubernetes_version, manifest[
            "kind"
        ]


@pytest.mark.parametrize(
    "break_it",
    [
        lambda d: d["spec"]["template"]["spec"]["containers"][0].update(imagePullPolicyy="Always"),  # a typo
        # a string port
        lambda d: d["spec"]["template"]["spec"]["containers"][0]["ports"][0].update(containerPort="8790"),
        # wrong key
        lambda d: d["spec"]["template"]["spec"]["containers"][0]["securityContext"].update(
            seccomp={"type": "Localhost"}
        ),
        lambda d: d["spec"].update(replica=2),
    ],
    ids=["typo", "wrong-type", "misplaced-key", "unknown-spec-field"],
)
def test_the_validator_rejects_a_mistyped_deployment(manifests, kubernetes_version, break_it):
    broken = copy.deepcopy(by_kind(manifests, "Deployment"))
    break_it(broken)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, kubernetes_version, strict=True)


# --- The sandbox service -------------------------------------------------------------------------------


def test_the_profile_names_the_rendered_service(cfg, manifests):
    """sandbox.url is where the clients connect; the Service is rendered from it, in the namespace."""
    assert (cfg.sandbox.kind, cfg.sandbox.url) == ("http", "http://flywheel-sandbox.flywheel.svc.cluster.local:8790")
    service = next(m for m in manifests if m["kind"] == "Service" and m["metadata"]["name"] == "flywheel-sandbox")
    assert service["metadata"]["namespace"] == cfg.orchestration.k8s.namespace
    assert service["spec"]["type"] == "ClusterIP" and service["spec"]["ports"][0]["port"] == 8790
    container = service_container(manifests)
    assert [p["name"] for p in container["ports"]] == [service["spec"]["ports"][0]["targetPort"]]
    pod_labels = by_kind(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert selects({"matchLabels": service["spec"]["selector"]}, pod_labels)


@pytest.mark.parametrize(
    "overrides",
    [
        {"sandbox.url": "http://flywheel-sandbox.other.svc.cluster.local:8790"},  # another namespace
        {"sandbox.url": "https://flywheel-sandbox.flywheel.svc.cluster.local:8790"},  # the service speaks plain HTTP
        {"sandbox.url": "http://10.0.0.7:8790"},
        {"sandbox.kind": "bubblewrap"},
    ],
    ids=["namespace", "https", "address", "not-http"],
)
def test_a_url_that_is_not_the_service_refuses_to_render(overrides):
    with pytest.raises(ValueError, match="sandbox.url"):
        km.sandbox_service(cluster_profile(overrides))


def test_the_service_runs_with_the_profiles_limits(cfg, manifests):
    """Parsed by the service's own parser: the client refuses a service whose limits differ."""
    from verifiers.sandbox_service import _PUBLIC, _parse_args

    command = service_container(manifests)["command"]
    assert command[:3] == ["python", "-m", "verifiers.sandbox_service"]
    args = _parse_args(command[3:])
    sandbox = cfg.sandbox
    assert (args.timeout_s, args.memory_mb, args.max_processes, args.max_files) == (
        sandbox.timeout_s,
        sandbox.memory_mb,
        sandbox.max_processes,
        sandbox.max_files,
    )
    assert (args.host, args.port, args.token_file, args.pool_size) == ("0.0.0.0", 8790, km.SANDBOX_TOKEN_FILE, 3)
    # the probes and the scrape path are routes the service serves without a token
    container = service_container(manifests)
    assert (
        container["readinessProbe"]["httpGet"]["path"]
        == container["livenessProbe"]["httpGet"]["path"]
        == km.HEALTH_PATH
    )
    annotations = by_kind(manifests, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert {km.HEALTH_PATH, annotations["prometheus.io/path"]} <= set(_PUBLIC)


@pytest.mark.integrity
def test_the_token_comes_from_a_secret_mounted_as_a_file_never_a_literal_nor_the_environment(
    cfg, manifests, monkeypatch
):
    """In the environment the token would stay readable in /proc/<pid>/environ for the service's
    life (os.environ.pop does not clear that): the Secret is a read-only file only root can read."""
    container = service_container(manifests)
    assert not container.get("env") and not container.get("envFrom"), container.get("env")
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "sandbox-token"]
    assert mount["readOnly"] and km.SANDBOX_TOKEN_FILE == f"{mount['mountPath']}/{km.SANDBOX_TOKEN_KEY}"
    pod = by_kind(manifests, "Deployment")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "sandbox-token"]
    assert volume["secret"] == {
        "secretName": km.SANDBOX_TOKEN_SECRET,
        "items": [{"key": km.SANDBOX_TOKEN_KEY, "path": km.SANDBOX_TOKEN_KEY}],
        "defaultMode": 0o400,
    }
    command = container["command"]
    assert command[command.index("--token-file") + 1] == km.SANDBOX_TOKEN_FILE
    assert "Secret" not in {m["kind"] for m in manifests}, "a rendered file must not hold the secret"
    # A token in the renderer's own environment ends up in no manifest.
    monkeypatch.setenv(cfg.sandbox.token_env, "tok-" + "9" * 40)
    assert "tok-" + "9" * 40 not in json.dumps(km.render_all(cfg, jobs=("sft",)))


def test_the_network_policy_admits_only_step_and_training_pods(cfg, manifests):
    """The labels come from dagster-k8s itself (a step pod as its step handler builds it, a Pipes
    pod as PipesK8sClient builds it) and from the rendered training job."""
    from dagster_k8s.job import DagsterK8sJobConfig, UserDefinedDagsterK8sConfig, construct_dagster_k8s_job
    from dagster_k8s.pipes import build_pod_body

    policy = by_kind(manifests, "NetworkPolicy")
    port = 8790
    k8s = cfg.orchestration.k8s
    job_config = DagsterK8sJobConfig(
        job_image="registry.example/flywheel:test", dagster_home="/opt/dagster/dagster_home"
    )

    def dagster_pod(component: str) -> dict[str, str]:
        job = construct_dagster_k8s_job(
            job_config,
            ["dagster", "api", "execute_step"],
            "dagster-step-x",
            user_defined_k8s_config=UserDefinedDagsterK8sConfig.from_dict(step_config(k8s, gpu=False)),
            component=component,
            labels={"dagster/op": "rl_round"},
        )
        return job.spec.template.metadata.labels

    pipes = build_pod_body(
        "flywheel-rl",
        "registry.example/flywheel:test",
        ["python", "-m", "assets.jobs", "rl_round"],
        {},
        {"labels": {"flywheel/job": "rl_round"}},
        json.loads(json.dumps(job_pod_spec(k8s))),
    ).metadata.labels
    training = next(m for m in manifests if m["kind"] == "Job")["spec"]["template"]["metadata"]["labels"]
    for labels in (dagster_pod("step_worker"), pipes, training):
        assert admitted(policy, labels, port), labels
    # the assets' launcher gives its pods that label (assets/launcher.py's base_pod_meta)
    assert re.search(
        r'base_pod_meta=\{"labels": \{"flywheel/job": job\}\}', (ROOT / "assets" / "launcher.py").read_text()
    )

    # Not the run pods, the Dagster services (the chart's labels), MLflow, or anything unlabelled.
    others = [
        dagster_pod("run_worker"),
        {
            "app.kubernetes.io/name": "dagster",
            "app.kubernetes.io/instance": "dagster",
            "component": "dagster-webserver",
        },
        {"app.kubernetes.io/name": "dagster", "component": "user-deployments", "deployment": "flywheel"},
        {"app.kubernetes.io/name": "mlflow", "app.kubernetes.io/instance": "mlflow"},
        {},
    ]
    for labels in others:
        assert not admitted(policy, labels, port), labels
    assert not admitted(policy, pipes, port + 1), "only the service's port"
    # No egress at all: both directions are governed, with no egress rule.
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"] and policy["spec"]["egress"] == []
    assert selects(
        policy["spec"]["podSelector"], by_kind(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    )
    # ...and the helper would notice a policy that admits everyone.
    assert admitted({"spec": {"ingress": [{}]}}, {}, port)
    assert admitted({"spec": {"ingress": [{"from": [{"namespaceSelector": {}}]}]}}, {}, port)


def test_the_pod_has_what_bubblewrap_needs_and_no_more(manifests):
    """docs/sandbox.md, "Bubblewrap in a Kubernetes pod"; the capability set was measured (the
    sandbox tests pass with exactly these five, and bwrap fails without NET_ADMIN)."""
    deployment = by_kind(manifests, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    security = service_container(manifests)["securityContext"]
    assert (security["runAsUser"], security["privileged"]) == (0, False)
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN", "NET_ADMIN", "SETUID", "SETGID", "KILL"]}
    # The API refuses allowPrivilegeEscalation: false next to CAP_SYS_ADMIN (the schema cannot tell).
    assert "allowPrivilegeEscalation" not in security
    assert security["seccompProfile"] == {"type": "Localhost", "localhostProfile": km.SECCOMP_PROFILE}
    assert security["appArmorProfile"] == {"type": "Unconfined"}
    assert security["readOnlyRootFilesystem"] is True
    assert pod["hostUsers"] is True and pod["automountServiceAccountToken"] is False
    assert pod["nodeSelector"] == km.SANDBOX_NODE_SELECTOR and pod["tolerations"] == km.SANDBOX_TOLERATIONS
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count; a re-apply would reset it"

    # The init container puts the ConfigMap's profile exactly where the kubelet looks for it;
    # only it mounts the host directory.
    (init,) = pod["initContainers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    name = Path(km.SECCOMP_PROFILE).name
    host_dir = volumes["host-seccomp"]["hostPath"]["path"]
    assert f"{mounts['host-seccomp']}/{name}" in init["command"][-1] and init["command"][-1].endswith(
        f" {mounts['host-seccomp']}/{name}"
    )
    assert f"{host_dir}/{name}" == f"{km.KUBELET_SECCOMP_DIR}/{km.SECCOMP_PROFILE}"
    assert f"{mounts['seccomp-profile']}/{name}" in init["command"][-1]
    config_map = by_kind(manifests, "ConfigMap")
    assert volumes["seccomp-profile"]["configMap"]["name"] == config_map["metadata"]["name"]
    assert (
        init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        and init["securityContext"]["allowPrivilegeEscalation"] is False
    )
    # the service mounts its scratch and its token (read-only), never the host directory
    assert {m["name"] for m in service_container(manifests)["volumeMounts"]} == {"tmp", "sandbox-token"}
    # A changed profile changes the pod template, so the pods roll and load it.
    profile = config_map["data"][name]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["flywheel/seccomp-profile-sha256"] == hashlib.sha256(profile.encode()).hexdigest()
    assert json.loads(profile) == km.seccomp_profile()


def test_the_seccomp_profile_allows_what_the_pool_does_and_refuses_the_rest():
    profile = km.seccomp_profile()
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    (rule,) = profile["syscalls"]
    denied = set(rule["names"])
    assert (rule["action"], rule["errnoRet"]) == ("SCMP_ACT_ERRNO", 1)
    # bwrap (namespaces, pivot_root + chroot into the new root, its hostname), the worker (the
    # scratch tmpfs, its own filters, uid drops, kills), the service (uvicorn falls back from io_uring)
    needed = {
        "clone",
        "clone3",
        "unshare",
        "mount",
        "umount2",
        "pivot_root",
        "chroot",
        "sethostname",
        "prctl",
        "seccomp",
        "capset",
        "setuid",
        "setgid",
        "setgroups",
        "kill",
        "memfd_create",
        "pidfd_open",
        "prlimit64",
    }
    assert not needed & denied, needed & denied
    assert {
        "ptrace",
        "process_vm_readv",
        "bpf",
        "setns",
        "io_uring_setup",
        "open_by_handle_at",
        "init_module",
        "kexec_load",
        "keyctl",
        "userfaultfd",
        "perf_event_open",
    } <= denied


def test_the_service_scales_on_cpu_and_is_drained_one_pod_at_a_time(manifests):
    deployment, hpa, pdb = (
        by_kind(manifests, kind) for kind in ("Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget")
    )
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu" and metric["resource"]["target"]["type"] == "Utilization"
    # with one replica, a budget of one unavailable pod would let a drain take the service down
    assert hpa["spec"]["minReplicas"] >= 2 and pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    # Utilization is relative to the request: there must be one, and memory covers the worst call.
    resources = service_container(manifests)["resources"]
    assert resources["requests"]["cpu"] == "3"
    assert resources["limits"]["memory"] == f"{3 * 8 * 256 + km.SERVICE_OVERHEAD_MB + km.TMP_MB}Mi"


# --- The multi-node training job ----------------------------------------------------------------------


def torchrun_args(command: list[str], node_rank: int):
    """The command as torchrun itself parses it, after Kubernetes expands $(NODE_RANK)."""
    from torch.distributed.run import get_args_parser

    assert command[:3] == ["python", "-m", "torch.distributed.run"]
    return get_args_parser().parse_args([arg.replace("$(NODE_RANK)", str(node_rank)) for arg in command[3:]])


@pytest.mark.parametrize("nnodes", [1, 4])
def test_a_job_of_n_nodes_has_n_indexed_pods_that_meet_at_pod_zero(nnodes):
    cfg = cluster_profile({"orchestration.k8s.gpus_per_step": 8})
    service, job = km.training_job(cfg, "rl_round", nnodes=nnodes)
    name = job["metadata"]["name"]
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"], spec["backoffLimit"]) == (
        "Indexed",
        nnodes,
        nnodes,
        0,
    )
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]

    # Pod i of an Indexed Job is named <job>-<i>; its subdomain puts it in the headless Service's DNS.
    assert service["spec"]["clusterIP"] == "None" and pod["subdomain"] == service["metadata"]["name"]
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": name}
    assert service["spec"]["publishNotReadyAddresses"] is True
    for rank in range(nnodes):
        args = torchrun_args(container["command"], rank)
        assert (args.nnodes, args.nproc_per_node, args.node_rank, args.rdzv_backend) == (
            str(nnodes),
            "8",
            rank,
            "static",
        )
        assert args.master_addr == f"{name}-0.{service['metadata']['name']}" and args.master_port == km.RENDEZVOUS_PORT
        assert (args.module, args.training_script, args.training_script_args) == (True, "assets.jobs", ["rl_round"])
    # $(NODE_RANK) expands only if the container defines it: from the Job's completion index
    (rank_env,) = [e for e in container["env"] if e["name"] == "NODE_RANK"]
    assert (
        rank_env["valueFrom"]["fieldRef"]["fieldPath"]
        == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )

    # G GPUs a pod on the GPU nodes, shared memory for NCCL, the app's env and identity
    k8s = cfg.orchestration.k8s
    assert (
        container["resources"]["limits"]["nvidia.com/gpu"]
        == container["resources"]["requests"]["nvidia.com/gpu"]
        == "8"
    )
    assert pod["nodeSelector"] == k8s.gpu_node_selector and pod["tolerations"] == k8s.gpu_tolerations
    assert container["image"] == CLUSTER_ENV["FLYWHEEL_TRAINER_IMAGE"]
    (shm,) = [v for v in pod["volumes"] if v["name"] == "dshm"]
    assert (
        shm["emptyDir"] == {"medium": "Memory"}
        and {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    )
    assert (
        container["envFrom"] == [{"secretRef": {"name": k8s.env_secret}}]
        and pod["serviceAccountName"] == k8s.service_account
    )
    assert spec["template"]["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"


def test_a_launcher_can_pass_its_environment_and_bad_names_are_refused(cfg):
    _, job = km.training_job(cfg, "sft", nnodes=2, env={"DAGSTER_PIPES_CONTEXT": "ctx"})
    assert {"name": "DAGSTER_PIPES_CONTEXT", "value": "ctx"} in job["spec"]["template"]["spec"]["containers"][0]["env"]
    with pytest.raises(ValueError, match="DNS label"):
        km.training_job(cfg, "rl_round", name="flywheel_rl_round")  # underscores: not a DNS name
    with pytest.raises(ValueError):
        km.training_job(cfg, "sft", nnodes=0)


# --- The CLI ---------------------------------------------------------------------------------------------


def test_the_cli_writes_one_file_per_object_in_apply_order(tmp_path, cluster_env):
    assert km.main(["--profile", "cluster", "--out", str(tmp_path), "--job", "sft", "--nnodes", "2"]) == 0
    files = sorted(tmp_path.glob("*.yaml"))
    loaded = [yaml.safe_load(path.read_text()) for path in files]
    assert loaded == km.render_all(load_profile("cluster"), jobs=("sft",), nnodes=2)
    kinds = [m["kind"] for m in loaded]
    assert kinds.index("ServiceAccount") < kinds.index("Deployment") and kinds.index("ConfigMap") < kinds.index(
        "Deployment"
    )
    assert not any("&id" in path.read_text() for path in files), "no YAML anchors: every object reads on its own"


@pytest.mark.parametrize(
    "args,named",
    [
        (["--set", "sandbox.kind=bubblewrap"], "sandbox.url"),
        (["--sandbox-min-replicas", "1"], "min_replicas"),
        (["--sandbox-min-replicas", "4", "--sandbox-max-replicas", "3"], "min_replicas"),
    ],
    ids=["not-http", "one-replica", "min-above-max"],
)
def test_the_cli_refuses_what_it_cannot_render_and_says_why(tmp_path, cluster_env, capsys, args, named):
    assert km.main(["--profile", "cluster", "--out", str(tmp_path), *args]) == 2
    assert named in capsys.readouterr().err and not list(tmp_path.iterdir())
