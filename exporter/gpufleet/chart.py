"""Copy the generated rules and dashboards into the Helm chart: ``python -m gpufleet.chart``.

Helm can only read files inside the chart directory, so ``helm/gpufleet/files/``
holds verbatim copies of ``alerts/*.rules.yaml`` (rendered as PrometheusRules)
and ``dashboards/*.json`` (rendered as Grafana sidecar ConfigMaps). ``make
generate`` runs this after the rule and dashboard builders; ``make
check-generated`` fails when a copy differs from its source. Copies whose
source is gone are removed, so a renamed dashboard leaves nothing behind.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

CHART_FILES = Path("helm/gpufleet/files")


@dataclass(frozen=True, slots=True)
class ChartCopy:
    """One kind of generated source copied into the chart."""

    source_dir: str
    pattern: str
    target_dir: str


COPIES = (
    ChartCopy("alerts", "*.rules.yaml", "rules"),
    ChartCopy("dashboards", "*.json", "dashboards"),
)


def sync_chart_files(root: Path) -> list[Path]:
    """Make ``root/helm/gpufleet/files`` mirror the sources; return the files written."""
    written = []
    for copy in COPIES:
        sources = sorted((root / copy.source_dir).glob(copy.pattern))
        target_dir = root / CHART_FILES / copy.target_dir
        target_dir.mkdir(parents=True, exist_ok=True)
        wanted = {source.name for source in sources}
        for stale in target_dir.glob(copy.pattern):
            if stale.name not in wanted:
                stale.unlink()
        for source in sources:
            target = target_dir / source.name
            content = source.read_bytes()
            if not target.exists() or target.read_bytes() != content:
                target.write_bytes(content)
            written.append(target)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpufleet.chart", description=__doc__)
    parser.add_argument("--root", default=".", help="repository root (default: .)")
    namespace = parser.parse_args(argv)
    root = Path(namespace.root)
    if not (root / "helm" / "gpufleet" / "Chart.yaml").exists():
        parser.error(f"--root {root}: no helm/gpufleet/Chart.yaml there; run from the repository")
    written = sync_chart_files(root)
    print(f"{len(written)} files in {root / CHART_FILES}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
