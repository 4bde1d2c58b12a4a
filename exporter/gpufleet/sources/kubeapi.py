"""The Kubernetes API server's Node list and watch, over HTTPS with the standard library.

``GET /api/v1/nodes?limit=500`` page by page (``continue``), then ``?watch=1&
resourceVersion=...&allowWatchBookmarks=true&timeoutSeconds=...``: a chunked response
of one JSON event per line (ADDED, MODIFIED, DELETED, BOOKMARK), ended by the server at
its timeout, or by an ERROR event (a ``Status``; 410 when the version asked for was
compacted away). Credentials: the pod's service account (its token re-read for every
request, as bound tokens rotate, and its CA), or a kubeconfig's server, CA and token
or client certificate.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.secrets import SecretFileError, read_secret_file

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
NODES_PATH = "/api/v1/nodes"
LIST_PAGE = 500


class KubeApiError(RuntimeError):
    """The API server could not be reached or refused; the message says which."""

    def __init__(self, message: str, status: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason or ("unreachable" if status is None else f"http_{status}")


class Gone(KubeApiError):
    """410: the resource version asked for is older than the server keeps; list again."""


@dataclass(frozen=True)
class ApiAccess:
    """Where the API server is and how to prove who we are to it."""

    server: str
    token: str | None = None
    token_file: str | None = None  # re-read for every request: bound tokens rotate
    ca_file: str | None = None
    ca_data: str | None = None  # PEM
    insecure: bool = False
    client_cert_pem: str | None = None
    client_key_pem: str | None = None

    def bearer(self) -> str | None:
        if self.token_file:
            try:
                return read_secret_file(self.token_file)
            except SecretFileError as error:
                raise KubeApiError(f"the service account token: {error}") from None
        return self.token

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.server.startswith("https:"):
            return None
        context = ssl.create_default_context(cafile=self.ca_file, cadata=self.ca_data)
        if self.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.client_cert_pem and self.client_key_pem:
            # ssl loads a certificate chain only from files: written 0600, loaded, removed.
            with tempfile.TemporaryDirectory() as directory:
                cert, key = Path(directory, "client.crt"), Path(directory, "client.key")
                for path, pem in ((cert, self.client_cert_pem), (key, self.client_key_pem)):
                    path.touch(0o600)
                    path.write_text(pem)
                context.load_cert_chain(cert, key)
        return context


def in_cluster_access(
    environ: Mapping[str, str] = os.environ, directory: Path = SERVICE_ACCOUNT_DIR
) -> ApiAccess:
    """The pod's own service account, as every in-cluster client finds it."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise ValueError(
            "not in a pod (KUBERNETES_SERVICE_HOST / _PORT are unset); give --kubeconfig"
        )
    token = directory / "token"
    if not token.exists():
        raise ValueError(
            f"no service account token at {token}: mount one (the chart does when "
            "fleet.kubeWatch.enabled) or give --kubeconfig"
        )
    host = f"[{host}]" if ":" in host else host
    return ApiAccess(f"https://{host}:{port}", token_file=str(token),
                     ca_file=str(directory / "ca.crt"))  # fmt: skip


def kubeconfig_access(path: str, context: str | None = None) -> ApiAccess:
    """The server and credentials of a kubeconfig's context (its current one by default):
    a token, a token file or a client certificate; exec and auth-provider plugins are not run."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        config = json.loads(text)
    except ValueError:
        import yaml  # kubeconfigs are YAML; the image has pyyaml (the sim extra)

        config = yaml.safe_load(text)
    if not isinstance(config, dict):
        raise ValueError(f"{path} is not a kubeconfig")
    base = Path(path).parent

    def named(section: str, name: str) -> dict[str, Any]:
        for entry in config.get(section) or []:
            if entry.get("name") == name:
                return dict(entry.get(section[:-1]) or {})
        raise ValueError(f"{path}: no {section[:-1]} named {name!r}")

    def file_path(value: str) -> str:
        return str(base / value) if not os.path.isabs(value) else value

    def data(value: str) -> str:
        return base64.b64decode(value).decode()

    chosen = context or config.get("current-context")
    if not chosen:
        raise ValueError(f"{path} has no current-context; give --context")
    ctx = named("contexts", chosen)
    cluster, user = named("clusters", ctx.get("cluster", "")), named("users", ctx.get("user", ""))
    if "exec" in user or "auth-provider" in user:
        raise ValueError(
            f"{path}: user {ctx.get('user')!r} authenticates through a plugin, which kube-watch "
            "does not run; give it a token (a service account's) or a client certificate"
        )
    if not cluster.get("server"):
        raise ValueError(f"{path}: cluster {ctx.get('cluster')!r} has no server")
    cert, key = user.get("client-certificate-data"), user.get("client-key-data")
    return ApiAccess(
        server=str(cluster["server"]).rstrip("/"),
        token=user.get("token"),
        token_file=file_path(user["tokenFile"]) if user.get("tokenFile") else None,
        ca_file=file_path(cluster["certificate-authority"])
        if cluster.get("certificate-authority")
        else None,
        ca_data=data(cluster["certificate-authority-data"])
        if cluster.get("certificate-authority-data")
        else None,
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        client_cert_pem=data(cert) if cert else _read(user.get("client-certificate"), base),
        client_key_pem=data(key) if key else _read(user.get("client-key"), base),
    )


def _read(name: str | None, base: Path) -> str | None:
    return (base / name).read_text() if name else None


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK
    object: dict[str, Any]

    @property
    def resource_version(self) -> str:
        return str((self.object.get("metadata") or {}).get("resourceVersion", ""))


class KubeApi:
    """LIST and WATCH of Node objects."""

    def __init__(self, access: ApiAccess, timeout: float = 30.0, page: int = LIST_PAGE) -> None:
        if not access.server.startswith(("https://", "http://")):
            raise ValueError(f"the API server {access.server!r} is not an https:// URL")
        self.access = access
        self.timeout = timeout
        self.page = page
        self._context = access.ssl_context()

    def _open(self, params: Mapping[str, str], timeout: float) -> Any:
        query = urllib.parse.urlencode(params)
        headers = {"Accept": "application/json", "User-Agent": "gpufleet-kube-watch"}
        token = self.access.bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        url = f"{self.access.server}{NODES_PATH}?{query}"
        request = urllib.request.Request(url, headers=headers)  # noqa: S310 - http(s) only
        try:
            return urllib.request.urlopen(request, timeout=timeout, context=self._context)  # noqa: S310
        except urllib.error.HTTPError as error:
            body = error.read().decode(errors="replace")
            try:
                message = json.loads(body).get("message", body)
            except (ValueError, AttributeError):
                message = body
            kind = Gone if error.code == 410 else KubeApiError
            raise kind(f"the API server answered {error.code}: {message}", error.code) from None
        except (urllib.error.URLError, OSError) as error:
            message = f"cannot reach the API server {self.access.server}: {error}"
            raise KubeApiError(message) from None

    def list_nodes(self) -> tuple[list[dict[str, Any]], str]:
        """Every Node, page by page, and the list's resource version to watch from."""
        items: list[dict[str, Any]] = []
        params = {"limit": str(self.page)}
        while True:
            with self._open(params, self.timeout) as response:
                try:
                    page = json.loads(response.read())
                except ValueError as error:
                    message = f"an undecodable node list: {error}"
                    raise KubeApiError(message, reason="decode") from None
            items += page.get("items") or []
            metadata = page.get("metadata") or {}
            if not metadata.get("continue"):
                return items, str(metadata.get("resourceVersion", ""))
            params = {"limit": str(self.page), "continue": str(metadata["continue"])}

    def watch_nodes(self, resource_version: str, timeout_s: int) -> Iterator[WatchEvent]:
        """Open a watch of the changes after ``resource_version``; its events until the
        server ends it (raises here when the watch cannot be opened)."""
        params = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_s),
        }
        # A read that waits longer than the server's own timeout is a dead connection.
        return self._events(self._open(params, timeout_s + self.timeout))

    @staticmethod
    def _events(response: Any) -> Iterator[WatchEvent]:
        with response:
            while True:
                try:
                    line = response.readline()
                except OSError as error:
                    raise KubeApiError(f"the watch broke off: {error}") from None
                if not line:
                    return
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                    kind, obj = str(event["type"]), dict(event["object"])
                except (ValueError, KeyError, TypeError) as error:
                    message = f"an undecodable watch event: {error}"
                    raise KubeApiError(message, reason="decode") from None
                if kind == "ERROR":
                    code = obj.get("code")
                    message = f"the watch ended with {code}: {obj.get('message', '')}"
                    raise (Gone if code == 410 else KubeApiError)(message, code)
                yield WatchEvent(kind, obj)
