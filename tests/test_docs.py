"""The user-facing docs speak of what the system does, not of the project's internal issue numbers (those
stay in docs/status.md, the history, and docs/testing.md, the suite's record)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HISTORY = {"status.md", "testing.md"}


def test_no_user_doc_names_an_internal_issue_number():
    docs = [REPO / "README.md", *(p for p in sorted((REPO / "docs").glob("*.md")) if p.name not in HISTORY)]
    found = [f"{p.relative_to(REPO)}:{n}: {line.strip()}" for p in docs
             for n, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"\b[Ii]ssues?[ -]\d", line)]
    assert not found, "\n".join(found)
