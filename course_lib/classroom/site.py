"""Build the course's static site from the committed, executed notebooks (nothing runs).

    python -m course_lib.classroom.site [--out build/site]

writes a folder that opens from disk (``build/site/index.html``): the course map first, then
one page per chapter in course order with its outputs, figures and math (each linking its
instructor's guide and saying how to open its slides), the comparison's tables and the guides,
with a search box. Explorers are shown as their static figure (the
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

__all__ = [
    "DEFAULT_OUT",
    "build",
    "code_span",
    "deck_omissions",
    "display_math_apart",
    "explorer_note",
    "markdown_excerpt",
    "stage",
    "stage_notebook",
    "teaching_note",
]

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


TEACH_NOTE = """\
:::{{admonition}} Teach this chapter
:class: course-teach
The [instructor's guide to this chapter](guides/{stem}.md) says what to stress, what learners
get wrong, what to discuss and which exercise to set. Its slides are this notebook as a deck:
open `notebooks/{stem}.ipynb` in JupyterLab and choose *View > Render as Reveal Slideshow*
(Alt+R; [Teach it](index.md#teach-it) says more). The guide lists
[what the deck leaves out](guides/{stem}.md#what-the-deck-leaves-out).
:::"""


def teaching_note(stem: str) -> dict:
    """The markdown cell, under a chapter's title cell on the site, that links its guide and
    says how to open its slides."""
    return {
        "cell_type": "markdown",
        "id": f"{stem}-site-teach",
        "metadata": {},
        "source": TEACH_NOTE.format(stem=stem),
    }


def display_math_apart(markdown: str) -> str:
    """``markdown`` with a blank line before and after each line that is one display equation
    (``$$...$$``). JupyterLab typesets such a line inside a paragraph; MyST reads display math
    only as a block of its own, and would otherwise take its inner ``$`` signs for inline math,
    leaving raw ``$`` on the page."""
    out: list[str] = []
    lines = markdown.split("\n")
    for i, line in enumerate(lines):
        text = line.strip()
        alone = len(text) > 4 and text.startswith("$$") and text.endswith("$$")
        if alone and out and out[-1].strip():
            out.append("")
        out.append(line)
        if alone and i + 1 < len(lines) and lines[i + 1].strip():
            out.append("")
    return "\n".join(out)


def _has_image(cell: dict) -> bool:
    return any("image/png" in output.get("data", {}) for output in cell.get("outputs", []))


def stage_notebook(source: Path, target: Path, guide: bool = False) -> int:
    """Copy a notebook for the site: widget state dropped, each explorer's outputs replaced by a
    note after it, each display equation its own paragraph and, with ``guide``, a note under the title cell linking the chapter's guide
    and saying how to open its slides. Returns the number of explorers."""
    nb = json.loads(source.read_text())
    nb["metadata"].pop("widgets", None)
    cells, explorers = [], 0
    for cell in nb["cells"]:
        cells.append(cell)
        if cell["cell_type"] == "markdown":
            cell["source"] = display_math_apart("".join(cell["source"]))
        if cell["cell_type"] == "code" and EXPLORER_CALL.search("".join(cell["source"])):
            explorers += 1
            cell["outputs"] = []
            code_above = [c for c in cells[:-1] if c["cell_type"] == "code"]
            has_figure = bool(code_above) and _has_image(code_above[-1])
            cells.append(explorer_note(source.name, has_figure, f"{cell['id']}-site-note"))
    if guide:
        cells.insert(1, teaching_note(source.stem))
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


# Inline markdown a cell's opening may hold, kept whole in an excerpt: code spans, math, links.
_INLINE = re.compile(
    r"(?P<code>(?P<ticks>`+).+?(?P=ticks))"
    r"|(?P<math>\$\$.+?\$\$|\$[^$\n]+?\$)"
    r"|\[(?P<link>[^\]\n]*)\]\([^)\n]*\)"
)
# Markdown punctuation that plain text escapes, so a cut never opens emphasis, a role or a tag.
_ESCAPED = re.compile(r"([\\`*_\[\]{}<>#|~$])")


def code_span(text: str) -> str:
    """``text`` as one markdown code span, whatever backticks it holds (CommonMark: a fence
    longer than any run of backticks inside, padded with a space where the text starts or ends
    with one)."""
    runs = [len(run) for run in re.findall(r"`+", text)]
    fence = "`" * (max(runs, default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def markdown_excerpt(source: str, limit: int = 90) -> str:
    """The opening of a markdown cell as inline markdown of about ``limit`` visible characters:
    its first paragraph (a heading's or a list's marker dropped), emphasis dropped, and code
    spans, math and link texts kept whole, so that the excerpt renders as the cell does. An
    unclosed ``$`` or backtick (math or code going on past the paragraph) ends it."""
    paragraph = []
    for line in source.strip().splitlines():
        if not line.strip():
            break
        paragraph.append(line.strip())
        if line.lstrip().startswith("#"):
            break
    text = re.sub(r"^(#+|[*+-]|\d+[.)]|>)\s+", "", " ".join(paragraph))
    pieces, length, position, cut = [], 0, 0, False

    def plain(chunk: str) -> bool:
        """Append plain text, cut at a word once over the limit; True when cut."""
        nonlocal length
        chunk = re.sub(r"\*+|(?<!\w)_+|_+(?!\w)", "", chunk)
        if length + len(chunk) > limit:
            room = chunk[: max(limit - length, 0)]
            chunk = room[: room.rfind(" ")] if " " in room else room
            pieces.append(_ESCAPED.sub(r"\\\1", chunk.rstrip()))
            return True
        pieces.append(_ESCAPED.sub(r"\\\1", chunk))
        length += len(chunk)
        return False

    for match in _INLINE.finditer(text):
        if plain(text[position : match.start()]):
            cut = True
            break
        position = match.end()
        kept = match.group("link") if match.group("link") is not None else match.group(0)
        if length + len(kept) > limit:
            cut = True
            break
        pieces.append(_ESCAPED.sub(r"\\\1", kept) if match.group("link") is not None else kept)
        length += len(kept)
    else:
        rest = text[position:]
        stop = re.search(r"[`$]", rest)  # an opener never closed in this paragraph
        cut = plain(rest[: stop.start()] if stop else rest) or stop is not None
    excerpt = "".join(pieces).rstrip()
    return f"{excerpt}..." if cut else excerpt


def deck_omissions(stem: str, spec: dict) -> str:
    """A guide's closing section, from the slide plan: the cells the deck leaves out (``skip``)
    or moves to the speaker notes (``notes``), each by its opening (a markdown cell's first
    paragraph as it renders, a code cell's first line as code)."""
    nb = json.loads((NOTEBOOKS / f"{stem}.ipynb").read_text())
    lines = []
    types = planned_types(nb, spec.get(stem, {}), stem)
    for cell, slide_type in zip(nb["cells"], types, strict=True):
        if slide_type in ("skip", "notes"):
            source = "".join(cell["source"])
            if cell["cell_type"] == "markdown":
                opening = markdown_excerpt(source)
            else:
                first = next((x.strip() for x in source.splitlines() if x.strip()), "")
                opening = code_span(first if len(first) <= 90 else first[:87] + "...")
            where = "left out" if slide_type == "skip" else "speaker notes"
            lines.append(f"- {where}: {cell['cell_type']} cell `{cell['id']}`: {opening}")
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
        has_guide = (GUIDES / f"{chapter.stem}.md").exists()
        counts["explorers"] += stage_notebook(source, staging / source.name, guide=has_guide)
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
