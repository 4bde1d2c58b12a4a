#!/usr/bin/env python3
"""Build every image `docker compose up` needs, on a machine that reaches Debian's archive
and PyPI but no image registry (Docker Hub, ghcr.io, quay.io):

  gpufleet-local/python:3.11-bookworm   the Dockerfile's base: Debian bookworm (minbase, by
                                        debootstrap) with python3 and python3-venv, this
                                        machine's pip index settings and CA certificates
  gpufleet-local/prometheus:3.5         Prometheus 3.5 LTS and Alertmanager 0.33 from Debian
  gpufleet-local/alertmanager:0.33      sid's packages (deploy/tools/fetch-prometheus3.sh, as
                                        `make prometheus3` fetches them) on that base, laid
                                        out like the official prom/* images
  gpufleet:<version>                    the product image, from the Dockerfile on that base

then `docker compose -f docker-compose.yml -f deploy/compose/local-images.yml up` runs the
demo on them (every service but Grafana, which Debian does not package). Each image is
built only when missing (the base image when its inputs changed); Docker's build cache
makes a rebuild of the others quick. Needs root (debootstrap), a running Docker engine and
the debootstrap package. Standard library only.

    python3 deploy/compose/local-images/build.py [--only base]
"""

from __future__ import annotations

import argparse
import configparser
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
BASE = "gpufleet-local/python:3.11-bookworm"
PROMETHEUS = "gpufleet-local/prometheus:3.5"
ALERTMANAGER = "gpufleet-local/alertmanager:0.33"
# Where fetch-prometheus3.sh keeps the .debs it downloaded (the tests' binaries' packages).
PROMETHEUS3 = REPO / ".tools" / "prometheus3"
MONITORING_DEBS = ("prometheus_", "promtool_", "prometheus-alertmanager_")
SUITE = "bookworm"
# What the official python:3.11-slim-bookworm base gives the Dockerfile: python (and pip
# through the venv), TLS roots.
PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates")
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# pip settings that mean the same inside a container; local paths (file://, /...) do not.
PIP_KEYS = ("index-url", "extra-index-url", "find-links", "trusted-host", "timeout", "retries",
            "proxy", "default-timeout")  # fmt: skip
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy",
                   "no_proxy")  # fmt: skip


def log(message: str) -> None:
    print(f"build.py: {message}", flush=True)


def run(*args: str, **kwargs: object) -> None:
    """Run a command; on failure, exit with the last lines of its output."""
    result = subprocess.run(args, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            check=False, **kwargs)  # type: ignore[call-overload]  # fmt: skip
    if result.returncode != 0:
        sys.exit(f"{result.stdout[-4000:]}\nbuild.py: {' '.join(args[:3])} ... failed "
                 f"(exit status {result.returncode})")  # fmt: skip


def image_exists(name: str) -> bool:
    found = subprocess.run(
        ["docker", "image", "inspect", name], capture_output=True, text=True, check=False
    )
    return found.returncode == 0


def product_image() -> str:
    """gpufleet:<version>, the name docker-compose.yml gives the image it builds."""
    match = re.search(r"^\s*image: (gpufleet:\S+)$", (REPO / "docker-compose.yml").read_text(),
                      re.MULTILINE)  # fmt: skip
    if match is None:
        sys.exit("build.py: docker-compose.yml names no gpufleet:<version> image")
    return match.group(1)


def pip_settings() -> str:
    """This machine's pip configuration for the image's /etc/pip.conf: the settings that
    mean the same inside a container (an index or a proxy, not a local directory), and
    pip's CA bundle pointed at the image's copy of this machine's certificates."""
    files = [Path("/etc/pip.conf"), Path("/etc/xdg/pip/pip.conf"),
             Path.home() / ".pip/pip.conf", Path.home() / ".config/pip/pip.conf"]  # fmt: skip
    if os.environ.get("PIP_CONFIG_FILE"):
        files.append(Path(os.environ["PIP_CONFIG_FILE"]))
    config = configparser.ConfigParser(interpolation=None)
    config.read([str(path) for path in files if path.is_file()])
    settings: dict[str, str] = {}
    for section in ("global", "install", "download"):
        if config.has_section(section):
            settings |= {key: config[section][key] for key in config[section] if key in PIP_KEYS}
    for key in PIP_KEYS:  # PIP_INDEX_URL and the like win, as they do for pip
        value = os.environ.get("PIP_" + key.upper().replace("-", "_"))
        if value:
            settings[key] = value
    lines = ["[global]", f"cert = {CA_BUNDLE}"]
    for key, value in sorted(settings.items()):
        kept = [word for word in value.split() if not re.match(r"(file:|/|\.)", word)]
        if kept:
            lines.append(f"{key} = {' '.join(kept)}")
    return "\n".join(lines) + "\n"


def debian_mirror() -> str:
    """The Debian archive this machine's apt uses (deb.debian.org if none is found)."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        for match in re.finditer(r"^(?:URIs:|deb)\s+(?:\[[^]]*\]\s+)?(\S+)", text, re.MULTILINE):
            uri = match.group(1)
            if uri.startswith("http") and "security" not in uri:
                return uri.rstrip("/")
    return "http://deb.debian.org/debian"


def build_base() -> None:
    pip_conf = pip_settings()
    mirror = debian_mirror()
    key_source = "\n".join([SUITE, mirror, *PACKAGES, pip_conf]).encode()
    bundle = CA_BUNDLE.read_bytes() if CA_BUNDLE.is_file() else b""
    key = hashlib.sha256(key_source + bundle).hexdigest()[:12]
    keyed = f"{BASE.split(':', maxsplit=1)[0]}:key-{key}"
    if image_exists(keyed):
        run("docker", "tag", keyed, BASE)
        log(f"{BASE} is up to date ({keyed}); debootstrap skipped")
        return
    if shutil.which("debootstrap") is None:
        sys.exit("build.py: debootstrap is not installed: apt-get install -y debootstrap")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpufleet-rootfs-") as scratch:
        root = Path(scratch) / "root"
        log(f"debootstrap --variant=minbase {SUITE} from {mirror} (about a minute)")
        run("debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE,
            str(root), mirror)  # fmt: skip
        # apt as the official debian images have it: the suite, its updates and security.
        security = "http://deb.debian.org/debian-security"
        (root / "etc/apt/sources.list").unlink(missing_ok=True)
        (root / "etc/apt/sources.list.d/debian.sources").write_text(
            f"Types: deb\nURIs: {mirror}\nSuites: {SUITE} {SUITE}-updates\nComponents: main\n"
            "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
            f"Types: deb\nURIs: {security}\nSuites: {SUITE}-security\nComponents: main\n"
            "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
        )
        # Packages installed in a build start no services (as in Debian's own images).
        policy = root / "usr/sbin/policy-rc.d"
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
        (root / "etc/pip.conf").write_text(pip_conf)
        if bundle:  # this machine's roots, its own CAs included (a TLS-inspecting proxy's)
            (root / CA_BUNDLE.relative_to("/")).write_bytes(bundle)
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (root / junk).glob("*"):
                if path.is_file():
                    path.unlink()
        tar = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "-c", "."],
                               stdout=subprocess.PIPE)  # fmt: skip
        run("docker", "import", "--change", "ENV LANG=C.UTF-8", "--change", 'CMD ["python3"]',
            "-", keyed, stdin=tar.stdout)  # fmt: skip
        if tar.wait() != 0:
            sys.exit("build.py: packing the root file system failed")
    run("docker", "tag", keyed, BASE)
    log(f"{BASE} built in {time.monotonic() - started:.0f} s")


def build_args() -> list[str]:
    args = []
    for name in PROXY_VARIABLES:  # Docker's predefined build arguments
        if os.environ.get(name):
            args += ["--build-arg", f"{name}={os.environ[name]}"]
    return args


def docker_build(tag: str, *args: str) -> None:
    started = time.monotonic()
    run("docker", "build", *build_args(), "-t", tag, *args)
    log(f"{tag} built in {time.monotonic() - started:.0f} s")


def monitoring_debs() -> list[Path]:
    """Debian sid's Prometheus, promtool and Alertmanager packages, fetched when missing
    (a no-op when `make prometheus3` already has them)."""
    run(str(REPO / "deploy" / "tools" / "fetch-prometheus3.sh"), str(PROMETHEUS3))
    debs = sorted(path for path in (PROMETHEUS3 / "debs").glob("*.deb")
                  if path.name.startswith(MONITORING_DEBS))  # fmt: skip
    if len(debs) != len(MONITORING_DEBS):
        sys.exit(f"build.py: expected {MONITORING_DEBS} packages in {PROMETHEUS3}/debs, "
                 f"found {[path.name for path in debs]}")  # fmt: skip
    return debs


def build_monitoring() -> None:
    """The Prometheus and Alertmanager stand-ins, from a context of the Dockerfile and the
    three .debs (nothing else of the checkout goes to the engine)."""
    debs = monitoring_debs()
    log(f"Prometheus / Alertmanager from {', '.join(path.name for path in debs)}")
    with tempfile.TemporaryDirectory(prefix="gpufleet-monitoring-") as scratch:
        context = Path(scratch)
        shutil.copy(HERE / "monitoring.Dockerfile", context / "Dockerfile")
        (context / "debs").mkdir()
        for path in debs:
            shutil.copy(path, context / "debs" / path.name)
        for tag, target in ((PROMETHEUS, "prometheus"), (ALERTMANAGER, "alertmanager")):
            docker_build(tag, "--build-arg", f"BASE_IMAGE={BASE}", "--target", target,
                         str(context))  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("base", "monitoring", "product"), action="append",
                        help="build only these (default: all)")  # fmt: skip
    only = set(parser.parse_args().only or ("base", "monitoring", "product"))
    if subprocess.run(["docker", "info"], capture_output=True, check=False).returncode != 0:
        sys.exit("build.py: no Docker engine answers `docker info`")
    if "base" in only:
        build_base()
    if "monitoring" in only:
        build_monitoring()
    if "product" in only:
        docker_build(product_image(), "--build-arg", f"PYTHON_IMAGE={BASE}", str(REPO))
    return 0


if __name__ == "__main__":
    sys.exit(main())
