"""The Prometheus and Alertmanager the project ships are the ones its tests run (issue 41):
the compose file's image tags, the local images' tags and the series
deploy/tools/fetch-prometheus3.sh pins (what `make prometheus3` fetches and the unmarked
tests run on) name the same major.minor. make test-containers checks the running
containers report them too."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
# fetch-prometheus3.sh's Debian package of each compose service's binary.
PACKAGES = {"prometheus": "prometheus", "alertmanager": "prometheus-alertmanager"}


def pinned_series() -> dict[str, str]:
    """package -> major.minor, from the fetch script's PINS=(package=series ...)."""
    script = (REPO / "deploy" / "tools" / "fetch-prometheus3.sh").read_text()
    match = re.search(r"^PINS=\((.*)\)$", script, re.MULTILINE)
    assert match is not None, "fetch-prometheus3.sh has no PINS=(...) line"
    return dict(pin.split("=", 1) for pin in match.group(1).split())


def series(tag: str) -> str:
    """major.minor of an image tag: v3.5.3 -> 3.5, 0.33 -> 0.33."""
    found = re.fullmatch(r"v?(\d+\.\d+)(?:\.\d+)?", tag)
    assert found is not None, f"{tag} is no version tag"
    return found.group(1)


def test_the_compose_images_are_the_series_the_tests_run() -> None:
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    pins = pinned_series()
    for service, package in PACKAGES.items():
        tag = services[service]["image"].rsplit(":", 1)[1]
        assert series(tag) == pins[package], (service, tag, pins[package])
    assert series(services["prometheus"]["image"].rsplit(":", 1)[1]).startswith("3.")


def test_the_local_images_are_tagged_with_the_same_series() -> None:
    local = yaml.safe_load((REPO / "deploy" / "compose" / "local-images.yml").read_text())
    pins = pinned_series()
    for service, package in PACKAGES.items():
        tag = local["services"][service]["image"].rsplit(":", 1)[1]
        assert series(tag) == pins[package], (service, tag, pins[package])


def test_a_compose_file_behind_the_tests_is_caught() -> None:
    assert series("v2.53.3") != pinned_series()["prometheus"]
    assert series("v0.27.0") != pinned_series()["prometheus-alertmanager"]
