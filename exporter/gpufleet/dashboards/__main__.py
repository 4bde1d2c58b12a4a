"""Write dashboards/*.json from the dashboards' code: ``python -m gpufleet.dashboards [--out DIR]``."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpufleet.dashboards.build import dashboards
from gpufleet.dashboards.common import render


def write_dashboards(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, board in dashboards().items():
        path = out / f"{stem}.json"
        path.write_text(render(board), encoding="utf-8")
        written.append(path)
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="dashboards", help="directory for the JSON files")
    for path in write_dashboards(Path(parser.parse_args().out)):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
