"""Slide metadata for RISE, written into the notebooks from one committed plan.

    python -m course_lib.classroom.slides            # write the metadata into every notebook
    python -m course_lib.classroom.slides --check    # say which cells disagree, change nothing

Every cell of a notebook gets ``metadata.slideshow.slide_type``, which ``jupyterlab-rise`` reads
to present the notebook as a deck. The plan lives in ``notebooks/slides.yaml``, keyed by cell id,
so that editing or re-executing a notebook never loses it. A cell the plan does not name gets the
type of :func:`default_slide_type`:

* a markdown cell that opens with a level-1 or level-2 heading (``#``, ``##``): ``slide``;
* a markdown cell that opens with a level-3 heading or with ``**Exercise``: ``subslide``;
* the first code cell (the imports, run once before anything else): ``subslide``;
* anything else: ``-`` (it continues the slide above).

The plan overrides that per cell with one of :data:`SLIDE_TYPES`: ``skip`` for what a class leaves
out (it stays in the notebook, hidden from the deck), ``notes`` for what the speaker view shows
beside the slide, ``fragment`` for a cell that appears on the next key press. Writing is
idempotent: a second run changes nothing. Notebook-level RISE options (:data:`RISE_OPTIONS`) are
written into ``metadata.rise``.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO_ROOT / "notebooks"
SPEC_FILE = NOTEBOOKS / "slides.yaml"
COMMAND = "python -m course_lib.classroom.slides"

SLIDE_TYPES = ("slide", "subslide", "fragment", "-", "skip", "notes")
# Long slides scroll instead of being cut off; the deck starts at the first cell and changes slide
# without an animation. Reveal.js's "white" theme ships its fonts (the default "simple" theme
# fetches them from the web).
RISE_OPTIONS = {
    "scroll": True,
    "start_slideshow_at": "beginning",
    "theme": "white",
    "transition": "none",
}

__all__ = [
    "COMMAND",
    "RISE_OPTIONS",
    "SLIDE_TYPES",
    "SPEC_FILE",
    "Disagreement",
    "apply",
    "default_slide_type",
    "disagreements",
    "load_spec",
    "planned_types",
]


@dataclass(frozen=True)
class Disagreement:
    notebook: str
    cell: str  # a cell id, or "metadata.rise" for the notebook's options
    stored: object
    planned: object

    def __str__(self) -> str:
        return f"{self.notebook} {self.cell}: stored {self.stored!r}, planned {self.planned!r}"


def default_slide_type(cell: dict, first_code: bool) -> str:
    """The slide type of a cell that the plan does not name (the rules in the module docstring)."""
    if cell["cell_type"] == "markdown":
        source = "".join(cell["source"]).lstrip()
        if re.match(r"#{1,2}\s", source):
            return "slide"
        if re.match(r"###\s", source) or source.startswith("**Exercise"):
            return "subslide"
        return "-"
    if cell["cell_type"] == "code" and first_code:
        return "subslide"
    return "-"


def load_spec(path: Path = SPEC_FILE) -> dict[str, dict[str, str]]:
    """The plan: ``{notebook stem: {cell id: slide type}}``, checked for unknown types."""
    import yaml  # installed with JupyterLab (jupyter_events)

    data = yaml.safe_load(path.read_text()) or {}
    notebooks = data.get("notebooks")
    if not isinstance(notebooks, dict):
        raise ValueError(
            f"{path}: expected a top-level mapping 'notebooks: {{stem: {{id: type}}}}'"
        )
    problems = []
    for stem, cells in notebooks.items():
        for cell_id, slide_type in (cells or {}).items():
            if not isinstance(cell_id, str):  # YAML reads 18223697 as a number
                problems.append(
                    f"{stem}: the id read as the number {cell_id!r}: quote ids made of digits"
                )
            elif slide_type not in SLIDE_TYPES:
                problems.append(f"{stem} {cell_id}: {slide_type!r} (allowed: {SLIDE_TYPES})")
    if problems:
        raise ValueError(f"{path}:\n" + "\n".join(problems))
    return {stem: dict(cells or {}) for stem, cells in notebooks.items()}


def planned_types(nb: dict, plan: dict[str, str], stem: str) -> list[str]:
    """The slide type of every cell of ``nb``: the plan's where it names the cell, else the rule.
    A plan entry whose cell id is not in the notebook is an error (the cell was removed or its
    id changed: fix ``notebooks/slides.yaml``)."""
    ids = [cell.get("id") for cell in nb["cells"]]
    stale = sorted(set(plan) - set(ids))
    if stale:
        raise ValueError(
            f"{SPEC_FILE.name} names cells that {stem}.ipynb does not have: {stale}; "
            "remove them from the plan or give their replacements' ids"
        )
    types, seen_code = [], False
    for cell in nb["cells"]:
        first_code = cell["cell_type"] == "code" and not seen_code
        seen_code = seen_code or cell["cell_type"] == "code"
        types.append(plan.get(cell.get("id")) or default_slide_type(cell, first_code))
    return types


def _notebooks(paths: list[Path] | None) -> list[Path]:
    return paths or sorted(NOTEBOOKS.glob("*.ipynb"))


def _stored(cell: dict) -> object:
    return cell.get("metadata", {}).get("slideshow", {}).get("slide_type")


def disagreements(paths: list[Path] | None = None, spec: dict | None = None) -> list[Disagreement]:
    """Every cell whose stored slide type differs from the plan's (nothing is written)."""
    import nbformat

    spec = load_spec() if spec is None else spec
    found = []
    for path in _notebooks(paths):
        nb = nbformat.read(path, as_version=4)
        types = planned_types(nb, spec.get(path.stem, {}), path.stem)
        for cell, planned in zip(nb.cells, types, strict=True):
            if _stored(cell) != planned:
                found.append(Disagreement(path.name, cell.get("id"), _stored(cell), planned))
        if nb.metadata.get("rise") != RISE_OPTIONS:
            found.append(
                Disagreement(path.name, "metadata.rise", nb.metadata.get("rise"), RISE_OPTIONS)
            )
    return found


def apply(paths: list[Path] | None = None, spec: dict | None = None) -> list[Path]:
    """Write the planned slide types (and the RISE options) into the notebooks; returns the
    notebooks that changed. Only ``metadata.slideshow`` and ``metadata.rise`` are touched."""
    import nbformat

    from course_lib.classroom.notebook_format import write_notebook

    spec = load_spec() if spec is None else spec
    changed = []
    for path in _notebooks(paths):
        nb = nbformat.read(path, as_version=4)
        types = planned_types(nb, spec.get(path.stem, {}), path.stem)
        dirty = nb.metadata.get("rise") != RISE_OPTIONS
        nb.metadata["rise"] = dict(RISE_OPTIONS)
        for cell, planned in zip(nb.cells, types, strict=True):
            if _stored(cell) != planned:
                cell.metadata["slideshow"] = {"slide_type": planned}
                dirty = True
        if dirty:
            write_notebook(nb, path)  # as JupyterLab saves it
            changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebook")
    parser.add_argument("--check", action="store_true", help="report disagreements, write nothing")
    args = parser.parse_args(argv)
    args.notebooks = [p.resolve() for p in args.notebooks]  # relative to where it is run
    try:
        return _run(args)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    unknown = sorted(set(load_spec()) - {p.stem for p in NOTEBOOKS.glob("*.ipynb")})
    if unknown:
        print(f"{SPEC_FILE.name} plans notebooks that do not exist: {unknown}", file=sys.stderr)
        return 1
    if args.check:
        found = disagreements(args.notebooks)
        for item in found:
            print(item)
        print(f"{len(found)} cells differ from the plan" + (f"; run `{COMMAND}`" if found else ""))
        return 1 if found else 0
    for path in apply(args.notebooks):
        print(f"wrote slide metadata into {path.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
