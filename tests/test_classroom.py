"""The classroom material without a browser: the course map in README, the guides, the site's
staging of the notebooks, and decks that run top to bottom without their skipped cells."""

import ast
import json
import re

import pytest

from course_lib.classroom import course_map, site, slides

NOTEBOOKS = sorted(slides.NOTEBOOKS.glob("*.ipynb"))
GUIDE_SECTIONS = (
    "## What to stress",
    "## Common misconceptions",
    "## Discussion questions",
    "## Exercise to set",
)


def test_readme_starts_with_the_course_map_that_the_notebooks_give():
    readme = course_map.README.read_text()
    assert course_map.readme_section() in readme, (
        "README's course map is out of date: run `python -m course_lib.classroom.course_map`"
    )
    first_section = readme.split("\n## ", 2)[1]
    assert first_section.startswith("The course map"), first_section[:80]
    assert course_map.START in first_section


def test_the_course_map_lists_every_notebook_in_file_order_with_known_prerequisites():
    stems = [c.stem for c in course_map.CHAPTERS]
    assert stems == [p.stem for p in NOTEBOOKS]
    seen = set()
    for chapter in course_map.CHAPTERS:
        assert set(chapter.assumes) <= seen, f"{chapter.stem} assumes a later chapter"
        seen.add(chapter.number)
    timings = course_map.read_timings()
    assert set(timings["notebooks"]) == set(stems), (
        "re-measure: python -m course_lib.classroom.timings"
    )


def test_the_reading_estimate_counts_what_the_notebook_holds():
    times = course_map.chapter_times("00_permutation_invariance")
    assert times["exercises"] == 2 and times["explorers"] == 1
    assert times["estimate_min"] % 5 == 0 and times["estimate_min"] >= 2 * 10 + 5


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_chapter_has_a_guide_with_its_four_parts(notebook):
    guide = slides.NOTEBOOKS / "guides" / f"{notebook.stem}.md"
    assert guide.exists(), f"no instructor's guide {guide.relative_to(slides.REPO_ROOT)}"
    text = guide.read_text()
    for heading in GUIDE_SECTIONS:
        assert heading in text, f"{guide.name}: missing {heading!r}"
    questions = text.split("## Discussion questions", 1)[1].split("\n## ", 1)[0]
    assert len(re.findall(r"^\d+\. ", questions, flags=re.M)) == 2, "two discussion questions"
    exercise = text.split("## Exercise to set", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"Exercise (\d+)", exercise))
    cells = json.loads(notebook.read_text())["cells"]
    prose = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    offered = set(re.findall(r"Exercise (\d+)", prose))
    assert named and named <= offered, (
        f"{guide.name} sets exercises {named}; the notebook has {offered}"
    )


def _names(tree: ast.AST, kind) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, kind):
            found.add(node.id)
        elif kind is ast.Store and isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif kind is ast.Store and isinstance(node, (ast.Import, ast.ImportFrom)):
            found |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif kind is ast.Store and isinstance(node, ast.arg):
            found.add(node.arg)
    return found


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_a_deck_runs_top_to_bottom_without_its_skipped_cells(notebook):
    """A skipped code cell is not run when a class steps through the deck: nothing a later cell
    on a slide uses may be defined only there."""
    nb = json.loads(notebook.read_text())
    types = slides.planned_types(nb, slides.load_spec().get(notebook.stem, {}), notebook.stem)
    defined_on_slides: set[str] = set()
    skipped_only: dict[str, str] = {}
    for cell, slide_type in zip(nb["cells"], types, strict=True):
        if cell["cell_type"] != "code":
            continue
        tree = ast.parse("".join(cell["source"]))
        if slide_type == "skip":
            for name in _names(tree, ast.Store) - defined_on_slides:
                skipped_only[name] = cell["id"]
            continue
        stored = _names(tree, ast.Store)  # its own names (comprehension targets, arguments)
        used = (_names(tree, ast.Load) - stored) & set(skipped_only)
        assert not used, (
            f"{notebook.name} cell {cell['id']} uses {sorted(used)}, defined only in the skipped "
            f"cell(s) {sorted({skipped_only[n] for n in used})}: show that cell in "
            "notebooks/slides.yaml"
        )
        defined_on_slides |= stored
        for name in stored:
            skipped_only.pop(name, None)


def test_the_site_shows_each_explorer_as_its_static_figure_with_a_note(tmp_path):
    source = slides.NOTEBOOKS / "03_rope.ipynb"
    target = tmp_path / source.name
    assert site.stage_notebook(source, target) == 1
    staged = json.loads(target.read_text())
    assert "widgets" not in staged["metadata"]
    index = next(
        i
        for i, c in enumerate(staged["cells"])
        if c["cell_type"] == "code" and course_map.EXPLORER_CALL.search("".join(c["source"]))
    )
    explorer, note = staged["cells"][index], staged["cells"][index + 1]
    assert explorer["outputs"] == []
    assert "The figure just above is this explorer" in note["source"]
    assert "notebooks/03_rope.ipynb" in note["source"]
    above = [c for c in staged["cells"][:index] if c["cell_type"] == "code"][-1]
    assert any("image/png" in o.get("data", {}) for o in above["outputs"])
    ids = [c["id"] for c in staged["cells"]]
    assert len(ids) == len(set(ids))


def test_each_chapter_on_the_site_links_its_guide_and_says_how_to_open_its_slides(tmp_path):
    source = slides.NOTEBOOKS / "03_rope.ipynb"
    target = tmp_path / source.name
    site.stage_notebook(source, target, guide=True)
    cells = json.loads(target.read_text())["cells"]
    note = cells[1]["source"]
    title = "".join(json.loads(source.read_text())["cells"][0]["source"])
    assert cells[0]["source"] == title
    assert "(guides/03_rope.md)" in note and "guides/03_rope.md#what-the-deck-leaves-out" in note
    assert "notebooks/03_rope.ipynb" in note and "Render as Reveal Slideshow" in note
    site.stage_notebook(source, target)
    assert not any(
        "guides/" in "".join(c["source"]) for c in json.loads(target.read_text())["cells"]
    )


def test_a_display_equation_inside_a_paragraph_becomes_its_own_block_on_the_site():
    text = "the last\nstep $S-1$:\n$$a = b$$\nWarm-up keeps\n\n$$c$$\n"
    assert (
        site.display_math_apart(text)
        == "the last\nstep $S-1$:\n\n$$a = b$$\n\nWarm-up keeps\n\n$$c$$\n"
    )
    assert site.display_math_apart("no math\nhere") == "no math\nhere"


def test_the_guides_on_the_site_list_what_each_deck_leaves_out():
    section = site.deck_omissions("03_rope", slides.load_spec())
    assert "left out: code cell `cell-043`: `show_source(" in section
    # a markdown cell by its opening as it renders (math kept as math), a code cell as code
    assert (
        "speaker notes: markdown cell `cell-014`: (The angles are float32: at position $p$"
        in section
    )
    assert "nothing" in site.deck_omissions("09_two_dimensions", {})


def test_a_cells_opening_in_a_guide_keeps_its_math_and_code_whole():
    assert site.code_span("print(x)") == "`print(x)`"
    assert site.code_span("a `b` c") == "``a `b` c``"
    assert site.code_span("`x") == "`` `x ``"
    excerpt = site.markdown_excerpt
    assert excerpt("## 3. The angle $\\theta_t$\nmore") == "3. The angle $\\theta_t$"
    assert excerpt("**Bold** and `co$de` and [a link](x.md)") == "Bold and `co$de` and a link"
    long = "Each pair turns at $\\omega_t = b^{-2t/d}$, " + "so the slowest one " * 10
    cut = excerpt(long, limit=60)
    assert cut.startswith("Each pair turns at $\\omega_t = b^{-2t/d}$,") and cut.endswith("...")
    # math or code that opens past the limit is left out whole, never cut open
    assert excerpt("word " * 15 + "$x + y$ tail", limit=80) == ("word " * 15).rstrip() + "..."
    assert excerpt("a math span $x +\n\ny$ that never closes") == "a math span..."
    for stem in (c.stem for c in course_map.CHAPTERS):
        for line in site.deck_omissions(stem, slides.load_spec()).splitlines():
            text = re.sub(r"(`+).+?\1|\$[^$]+\$", "", line)
            assert "`" not in text and "$" not in text, line
