"""Build the course's static site from the committed, executed notebooks (nothing runs).

    python -m course_lib.classroom.site [--out build/site]

writes a folder that opens from disk (``build/site/index.html``): the course map first, then
one page per chapter in course order with its outputs, figures and math, the comparison's tables
and the instructor's guides, with a search box. Explorers are shown as their static figure (the
code cell above each one draws it) with a note on running them live.

The sources are staged in ``<out>-src`` (``site/``'s configuration and stylesheet, a copy of
each notebook with its explorer outputs replaced by that note, the generated course map page,
``figures/compare_cpu/summary.md``, ``notebooks/guides/``), then Sphinx with myst-nb builds them
(``site/conf.py`` says why that tool). Warnings fail the build: a broken link between pages
stops it.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

from course_lib.classroom.course_map import CHAPTERS, EXPLORER_CALL, render
from course_lib.classroom.slides import load_spec, planned_types

REPO_ROOT = Path(__file__).resolve().parents[2]
SITE_SOURCES = REPO_ROOT / "site"
NOTEBOOKS = REPO_ROOT / "notebooks"
GUIDES = NOTEBOOKS / "guides"
COMPARISON = REPO_ROOT / "figures" / "compare_cpu" / "summary.md"
DEFAULT_OUT = REPO_ROOT / "build" / "site"

__all__ = ["DEFAULT_OUT", "build", "deck_omissions", "explorer_note", "stage", "stage_notebook"]

LIVE_NOTE = """\
:::{{note}}
**Explorer.** {figure} In JupyterLab this cell shows controls that redraw it: to move them,
open `notebooks/{name}` there and run the notebook ([Run it live](index.md#run-it-live)).
:::"""


def explorer_note(notebook_name: str, has_figure: bool, cell_id: str) -> dict:
    """The markdown cell (id ``cell_id``) that stands in for an explorer's widgets on the site."""
    figure = (
        "The figure just above is this explorer at one setting."
        if has_figure
        else "It draws a figure for the setting you choose."
    )
    return {
        "cell_type": "markdown",
        "id": cell_id,
        "metadata": {},
        "source": LIVE_NOTE.format(figure=figure, name=notebook_name),
    }


def _has_image(cell: dict) -> bool:
    return any("image/png" in output.get("data", {}) for output in cell.get("outputs", []))


def stage_notebook(source: Path, target: Path) -> int:
    """Copy a notebook for the site: widget state dropped, each explorer's outputs replaced by a
    note after it. Returns the number of explorers."""
    nb = json.loads(source.read_text())
    nb["metadata"].pop("widgets", None)
    cells, explorers = [], 0
    for cell in nb["cells"]:
        cells.append(cell)
        if cell["cell_type"] == "code" and EXPLORER_CALL.search("".join(cell["source"])):
            explorers += 1
            cell["outputs"] = []
            code_above = [c for c in cells[:-1] if c["cell_type"] == "code"]
            has_figure = bool(code_above) and _has_image(code_above[-1])
            cells.append(explorer_note(source.name, has_figure, f"{cell['id']}-site-note"))
    nb["cells"] = cells
    target.write_text(json.dumps(nb, ensure_ascii=False))
    return explorers


INDEX = """\
# Positional encodings, from scratch to Triton

A hands-on course on how a transformer knows *where* a token is. Each chapter builds one
positional encoding from its formula in plain PyTorch, checks its properties cell by cell, lets
you play with it, then swaps in a fused Triton kernel and checks that the kernel computes the
same thing, forward and backward. The course ends by training a small BERT with every encoding
under the same budget and comparing them.

These pages are the notebooks as they were last run, with their outputs; nothing here runs.

## The course map

{course_map}

## Run it live

The explorers (sliders and dropdowns that redraw a figure) and the exercises need the notebooks
running in JupyterLab. From a checkout of the course's repository:

```bash
python3 -m venv .venv && .venv/bin/python -m pip install -r requirements.txt && .venv/bin/python -m jupyter lab notebooks/
```

On a machine without a GPU, install the CPU build of PyTorch first (README says how): every
notebook runs on a CPU, the Triton kernels in Triton's interpreter.

## Teach it

Every notebook is also a slide deck: open it in JupyterLab and choose *View > Render as Reveal
Slideshow* (or press Alt+R). The deck uses the notebook's kernel: Shift+Enter runs the cell on a
slide and moves on, and the explorers work on their slides. The
[instructor's guides](guides/index.md) say, chapter by chapter, what to stress, what learners
get wrong, what to discuss and which exercise to set; the deck leaves out what a class can skip
(it stays in the notebook).

```{{toctree}}
:maxdepth: 1
:caption: Chapters
:hidden:

{chapters}
```

```{{toctree}}
:maxdepth: 1
:caption: Results and teaching
:hidden:

comparison
guides/index
```
"""

GUIDES_INDEX = """\
# Instructor's guides

One page per chapter: what to stress, common misconceptions, two questions for discussion and
the exercise to set. Each chapter's slide deck (RISE, from the notebook) follows the notebook's
sections; what it skips is listed in the guide.

```{{toctree}}
:maxdepth: 1

{guides}
```
"""


def deck_omissions(stem: str, spec: dict) -> str:
    """A guide's closing section, from the slide plan: the cells the deck leaves out (``skip``)
    or moves to the speaker notes (``notes``), by their first line."""
    nb = json.loads((NOTEBOOKS / f"{stem}.ipynb").read_text())
    lines = []
    types = planned_types(nb, spec.get(stem, {}), stem)
    for cell, slide_type in zip(nb["cells"], types, strict=True):
        if slide_type in ("skip", "notes"):
            first = next((x.strip() for x in "".join(cell["source"]).splitlines() if x.strip()), "")
            first = first if len(first) <= 90 else first[:87] + "..."
            where = "left out" if slide_type == "skip" else "speaker notes"
            lines.append(f"- {where}: {cell['cell_type']} cell `{cell['id']}`: `{first}`")
    body = "\n".join(lines) or "- nothing: every cell is on a slide"
    return (
        "\n\n## What the deck leaves out\n\nFrom `notebooks/slides.yaml` (the notebook keeps "
        f"every cell):\n\n{body}\n"
    )


def stage(staging: Path) -> dict:
    """Write the site's sources into ``staging`` (emptied first); returns counts."""
    if staging.exists():
        shutil.rmtree(staging)
    shutil.copytree(SITE_SOURCES, staging)
    counts = {"chapters": 0, "explorers": 0, "guides": 0}
    for chapter in CHAPTERS:
        source = NOTEBOOKS / f"{chapter.stem}.ipynb"
        counts["explorers"] += stage_notebook(source, staging / source.name)
        counts["chapters"] += 1
    listed = {f"{c.stem}.ipynb" for c in CHAPTERS}
    missing = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb") if p.name not in listed)
    if missing:
        raise ValueError(
            f"notebooks not in the course map: {missing}; add them to "
            "course_lib/classroom/course_map.py (CHAPTERS)"
        )
    (staging / "index.md").write_text(
        INDEX.format(
            course_map=render(link_prefix="", suffix=".ipynb"),
            chapters="\n".join(c.stem for c in CHAPTERS),
        )
    )
    comparison = COMPARISON.read_text()
    (staging / "comparison.md").write_text(
        re.sub(r"^# .*", "# The comparison's tables", comparison, count=1, flags=re.M)
        if comparison.startswith("# ")
        else "# The comparison's tables\n\n" + comparison
    )
    guides = staging / "guides"
    guides.mkdir()
    names, spec = [], load_spec()
    for chapter in CHAPTERS:
        guide = GUIDES / f"{chapter.stem}.md"
        if guide.exists():
            text = guide.read_text().rstrip("\n") + deck_omissions(chapter.stem, spec)
            (guides / guide.name).write_text(text)
            names.append(chapter.stem)
    counts["guides"] = len(names)
    (guides / "index.md").write_text(GUIDES_INDEX.format(guides="\n".join(names)))
    return counts


def build(out: Path = DEFAULT_OUT, jobs: int = 2) -> Path:
    """Stage the sources next to ``out`` and build the HTML site into ``out``."""
    from sphinx.cmd.build import build_main

    out = out.resolve()
    staging = out.parent / f"{out.name}-src"
    counts = stage(staging)
    if out.exists():
        shutil.rmtree(out)
    args = [
        "-b", "html", "-q", "-W", "--keep-going", "-j", str(jobs),
        "-d", str(out.parent / f"{out.name}-doctrees"), str(staging), str(out),
    ]  # fmt: skip
    if build_main(args) != 0:
        raise SystemExit("the site did not build: Sphinx's warnings above say why")
    print(
        f"built {counts['chapters']} chapters ({counts['explorers']} explorers as static "
        f"figures), the comparison and {counts['guides']} guides into {out}"
    )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="default: build/site")
    parser.add_argument("--jobs", type=int, default=2, help="Sphinx processes (default 2)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    out = build(args.out, args.jobs)
    print(f"open {out / 'index.html'} ({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())
