"""Sections of a document that a command generates: the text between `<!-- NAME:begin -->` and
`<!-- NAME:end -->`, replaced whole (the rest of the document is the authors')."""

from __future__ import annotations


def splice(doc: str, section: str, text: str) -> str:
    """`doc` with section `section` replaced by `text`; ValueError when its markers are missing."""
    begin, end = f"<!-- {section}:begin -->\n", f"<!-- {section}:end -->"
    if begin not in doc or end not in doc:
        raise ValueError(f"the document has lost its {begin.strip()} … {end} markers")
    head, rest = doc.split(begin, 1)
    return head + begin + text + end + rest.split(end, 1)[1]
