"""Which Kubernetes pod a training rank runs in, from the downward API.

The client sends it to the agent once per request, as two headers, so the agent can
name the training job on the pod's GPUs (``training_job`` on
``gpufleet_gpu_allocation_info``). Headers rather than body fields: an agent from
before them ignores them, so a newer training image never loses events to an older
agent. Standard library only, like the rest of the client.
"""

from __future__ import annotations

import os
import re

NAMESPACE_HEADER = "X-Gpufleet-Namespace"
POD_HEADER = "X-Gpufleet-Pod"

# Kubernetes' own rules: a namespace is a DNS-1123 label, a pod name a DNS-1123 subdomain.
NAMESPACE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
POD_NAME = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def pod_from_environment() -> tuple[str, str] | None:
    """(namespace, pod) from GPUFLEET_NAMESPACE / GPUFLEET_POD, else POD_NAMESPACE /
    POD_NAME (the downward API's ``metadata.namespace`` and ``metadata.name``); None when
    either is missing or is not a Kubernetes name."""
    namespace = os.environ.get("GPUFLEET_NAMESPACE") or os.environ.get("POD_NAMESPACE")
    pod = os.environ.get("GPUFLEET_POD") or os.environ.get("POD_NAME")
    if not namespace or not pod:
        return None
    namespace, pod = namespace.strip(), pod.strip()
    if not NAMESPACE_NAME.match(namespace) or not POD_NAME.match(pod):
        return None
    return namespace, pod


def pod_headers() -> dict[str, str]:
    """The headers that tell the agent this rank's pod (none outside Kubernetes)."""
    found = pod_from_environment()
    if found is None:
        return {}
    return {NAMESPACE_HEADER: found[0], POD_HEADER: found[1]}
