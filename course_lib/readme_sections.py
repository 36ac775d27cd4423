"""README sections generated from the repository's own results.

A generated section lies between two comment lines, ``<!-- NAME: start -->`` and
``<!-- NAME: end -->``, that Markdown does not show. Its generator writes the text between them
(the course map, the comparison's headline, the static GPU model), and a test checks that
README holds what the committed results generate: the README is never edited by hand there.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["README", "markers", "replace_section", "section"]

README = Path(__file__).resolve().parents[1] / "README.md"


def markers(name: str) -> tuple[str, str]:
    """The start and end lines of the section ``name``."""
    return f"<!-- {name}: start -->", f"<!-- {name}: end -->"


def section(name: str, body: str) -> str:
    """The section as it stands in README: markers around ``body`` (one newline after it)."""
    start, end = markers(name)
    return f"{start}\n{body.rstrip()}\n{end}"


def replace_section(name: str, body: str, path: str | Path | None = None) -> bool:
    """Put ``body`` between the markers of ``name`` in ``path`` (README.md by default); returns
    whether the file changed. A file without both markers is an error that names them."""
    path = Path(path) if path is not None else README
    text = path.read_text(encoding="utf-8")
    start, end = markers(name)
    if start not in text or end not in text:
        raise ValueError(f"{path} has no {name!r} section: add the lines {start} and {end}")
    before, rest = text.split(start, 1)
    after = rest.split(end, 1)[1]
    new = before + section(name, body) + after
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text
