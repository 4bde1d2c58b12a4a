"""The one Prometheus HTTP API client, against a real Prometheus."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from gpufleet.lab.devstack import PrometheusServer
from gpufleet.lab.processes import free_port
from gpufleet.promapi import PrometheusApi, PrometheusError, PrometheusUnreachable


def test_instant_and_range_queries_answer_from_prometheus(
    prometheus_factory: Callable[..., PrometheusServer],
) -> None:
    api = PrometheusApi(prometheus_factory(scrape_configs=[]).url)
    now = time.time()
    [sample] = api.query("vector(7)", at=now)
    assert float(sample["value"][1]) == 7
    assert sample["value"][0] == pytest.approx(now, abs=1e-3)
    [series] = api.query_range("vector(1)", now - 60, now, 15)
    assert [float(t) for t, _ in series["values"]] == pytest.approx(
        [now - 60 + 15 * i for i in range(5)], abs=1e-3
    )
    assert api.get("rules")["groups"] == []


def test_a_refused_query_names_the_query_and_prometheus_s_error(
    prometheus_factory: Callable[..., PrometheusServer],
) -> None:
    api = PrometheusApi(prometheus_factory(scrape_configs=[]).url)
    with pytest.raises(PrometheusError) as caught:
        api.query_range("sum(rate(up[5m])", 0, 60, 15)
    message = str(caught.value)
    assert "query_range 'sum(rate(up[5m])'" in message
    assert "unclosed left parenthesis" in message
    assert not isinstance(caught.value, PrometheusUnreachable)


def test_no_prometheus_is_unreachable_not_refused() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(PrometheusUnreachable, match=f"cannot query Prometheus at {url}"):
        PrometheusApi(url, timeout=5.0).query("up")
