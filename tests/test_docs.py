"""The documentation states what the code does: the site's knob list is the config's
fields, and every test the pages cite as evidence exists."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from gpufleet.rules.config import RulesConfig

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_the_configuration_page_lists_every_knob_and_no_other() -> None:
    page = (REPO / "docs/configuration.md").read_text()
    knobs_section = page.split("\n## Knobs\n", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `([a-z0-9_]+)` \|", knobs_section, flags=re.MULTILINE)
    fields = [field.name for field in dataclasses.fields(RulesConfig)]
    assert len(listed) == len(set(listed)), "a knob is listed twice"
    assert set(listed) == set(fields), (
        f"missing from docs/configuration.md: {sorted(set(fields) - set(listed))}; "
        f"not a knob: {sorted(set(listed) - set(fields))}"
    )


def _test_names() -> set[str]:
    names: set[str] = set()
    for path in (REPO / "tests").rglob("*.py"):
        names.update(re.findall(r"^\s*(?:async )?def (test_\w+)", path.read_text(), re.MULTILINE))
    return names


def test_every_test_the_documentation_cites_exists() -> None:
    defined = _test_names()
    missing: list[str] = []
    for page in PAGES:
        if page.is_symlink():
            continue
        text = page.read_text()
        for path in re.findall(r"\b(tests/[\w/]+\.py)\b", text):
            if not (REPO / path).is_file():
                missing.append(f"{page.name}: {path}")
        for name in re.findall(r"`[^`]*?\b(test_\w+)`", text) + re.findall(r"::(test_\w+)", text):
            if name not in defined and not (REPO / f"tests/{name}.py").is_file():
                missing.append(f"{page.name}: {name}")
        for path in re.findall(r"\b(alerts/tests/[\w.-]+\.yaml)\b", text):
            if not (REPO / path).is_file():
                missing.append(f"{page.name}: {path}")
    assert not missing, missing
