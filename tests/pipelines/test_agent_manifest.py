"""The served agent on the cluster (pipelines/k8s_manifests.py::agent_server): valid objects for the
eks module's Kubernetes version, the command `make serve` runs (parsed by its own parser), a GPU
where the profile rolls out with vLLM, and a way through the sandbox service's NetworkPolicy."""

from __future__ import annotations

import kubernetes_validate
import pytest

import pipelines.k8s_manifests as km
from tests.pipelines.test_k8s_manifests import admitted, by_kind, cluster_profile
from tests.terraform_support import module

pytestmark = pytest.mark.serving


@pytest.fixture(scope="module")
def rendered():
    return km.render_all(cluster_profile(), agent="champion")


def _agent(rendered: list[dict]) -> tuple[dict, dict]:
    deployment = next(m for m in rendered if m["kind"] == "Deployment" and m["metadata"]["name"] == "flywheel-agent")
    service = next(m for m in rendered if m["kind"] == "Service" and m["metadata"]["name"] == "flywheel-agent")
    return deployment, service


def test_the_agent_objects_validate_strictly_for_the_eks_version(rendered):
    version = module("eks").default("kubernetes_version")
    for manifest in _agent(rendered):
        assert kubernetes_validate.validate(manifest, version, strict=True) == version


def test_the_pod_runs_make_serves_command_on_a_gpu_and_the_service_reaches_it(rendered, monkeypatch):
    import argparse

    from pipelines import serve

    deployment, service = _agent(rendered)
    pod = deployment["spec"]["template"]
    [container] = pod["spec"]["containers"]
    assert container["command"][:3] == ["python", "-m", "pipelines.serve"]
    # the arguments are the ones pipelines.serve accepts: its own parser, stopped before it serves
    seen = {}

    def stop(self, args=None, namespace=None):
        seen["args"] = real_parse(self, args, namespace)
        raise SystemExit(0)

    real_parse = argparse.ArgumentParser.parse_args
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop)
    with pytest.raises(SystemExit):
        serve.main(container["command"][3:])
    args = seen["args"]
    assert (args.alias, args.host, args.port, args.profile) == ("champion", "0.0.0.0", km.AGENT_PORT, "cluster")
    # the cluster profile rolls out with vLLM: one GPU, on the GPU nodes
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pod["spec"]["nodeSelector"] == cluster_profile().orchestration.k8s.gpu_node_selector
    assert container["envFrom"] == [{"secretRef": {"name": "flywheel-env"}}]  # MLflow, S3, the sandbox token
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert service["spec"]["ports"][0]["targetPort"] == container["ports"][0]["name"]
    # an HF profile serves on a CPU node
    cpu = km.agent_server(cluster_profile({"rollout.engine": "hf"}), alias="challenger", profile="cluster")
    cpu_pod = cpu[0]["spec"]["template"]["spec"]
    assert "nvidia.com/gpu" not in str(cpu_pod["containers"][0]["resources"]) and "nodeSelector" not in cpu_pod


def test_the_sandbox_service_admits_the_agent_pods(rendered):
    """The agent's code runs in the sandbox service, whose NetworkPolicy admits only its clients."""
    policy = by_kind([m for m in rendered if m["metadata"]["name"] == "flywheel-sandbox"], "NetworkPolicy")
    deployment, _ = _agent(rendered)
    assert admitted(policy, deployment["spec"]["template"]["metadata"]["labels"], 8790)
    assert not admitted(policy, {"app.kubernetes.io/name": "something-else"}, 8790)
