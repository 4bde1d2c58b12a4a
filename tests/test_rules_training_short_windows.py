"""The 15 s and 60 s promtool cases of the rules' short windows are what
tests/training_short_window_cases.py makes (test_rules.py runs them with every other case)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from training_short_window_cases import INTERVALS_S, files

RUN = "run `python tests/training_short_window_cases.py`"


def test_committed_short_window_cases_are_what_the_generator_makes() -> None:
    made = files()
    assert len(made) == len(INTERVALS_S)
    for path, text in made.items():
        assert path.exists(), f"{RUN}: {path.name} missing"
        assert path.read_text() == text, f"{RUN}: {path.name}"
