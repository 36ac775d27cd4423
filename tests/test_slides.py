"""The slide plan (notebooks/slides.yaml) and the notebooks' RISE metadata agree, and the tool
that writes one into the other follows its rule and is idempotent."""

import json
import shutil

import pytest

from course_lib.classroom import slides


def test_every_notebook_carries_the_planned_slide_metadata():
    found = slides.disagreements()
    listed = "\n".join(str(d) for d in found[:20])
    assert not found, (
        f"{len(found)} cells differ from notebooks/slides.yaml (first 20):\n{listed}\n"
        f"Run `{slides.COMMAND}` to write the plan into the notebooks."
    )


def test_the_plan_names_only_existing_notebooks_and_cells():
    spec = slides.load_spec()
    stems = {p.stem for p in slides.NOTEBOOKS.glob("*.ipynb")}
    assert set(spec) <= stems, sorted(set(spec) - stems)
    for stem, plan in spec.items():
        nb = json.loads((slides.NOTEBOOKS / f"{stem}.ipynb").read_text())
        slides.planned_types(nb, plan, stem)  # raises on a cell id the notebook lacks


def test_every_deck_starts_with_a_slide_and_leaves_no_section_out():
    for path in sorted(slides.NOTEBOOKS.glob("*.ipynb")):
        nb = json.loads(path.read_text())
        types = slides.planned_types(nb, slides.load_spec().get(path.stem, {}), path.stem)
        assert types[0] == "slide", path.name
        for cell, slide_type in zip(nb["cells"], types, strict=True):
            source = "".join(cell["source"]).lstrip()
            if cell["cell_type"] == "markdown" and source.startswith("## "):
                assert slide_type == "slide", f"{path.name} {cell['id']}: a section is {slide_type}"


def _cell(kind, source, cell_id):
    return {"cell_type": kind, "source": source, "id": cell_id, "metadata": {}}


def test_the_rule_for_cells_the_plan_does_not_name():
    nb = {
        "cells": [
            _cell("markdown", "# Title", "a"),
            _cell("code", "import torch", "b"),
            _cell("markdown", "## 1. Section", "c"),
            _cell("code", "x = 1", "d"),
            _cell("markdown", "### A sub-section", "e"),
            _cell("markdown", "**Exercise 1.** Do it", "f"),
            _cell("markdown", "Plain prose", "g"),
        ]
    }
    assert slides.planned_types(nb, {}, "toy") == [
        "slide", "subslide", "slide", "-", "subslide", "subslide", "-",
    ]  # fmt: skip
    assert slides.planned_types(nb, {"g": "notes", "d": "skip"}, "toy")[3::3] == ["skip", "notes"]
    with pytest.raises(ValueError, match=r"does not have: \['zz'\]"):
        slides.planned_types(nb, {"zz": "skip"}, "toy")


def test_bad_plans_are_refused_with_the_reason(tmp_path):
    plan = tmp_path / "slides.yaml"
    plan.write_text("notebooks:\n  00_x:\n    cell-1: slyde\n    12345: skip\n")
    with pytest.raises(ValueError) as error:
        slides.load_spec(plan)
    assert "'slyde' (allowed:" in str(error.value)
    assert "quote ids made of digits" in str(error.value)


def test_applying_writes_only_slide_metadata_and_is_idempotent(tmp_path):
    source = sorted(slides.NOTEBOOKS.glob("*.ipynb"))[0]
    copy = tmp_path / source.name
    shutil.copy(source, copy)
    for cell in (nb := json.loads(copy.read_text()))["cells"]:
        cell["metadata"].pop("slideshow", None)
    nb["metadata"].pop("rise", None)
    copy.write_text(json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    spec = {source.stem: slides.load_spec().get(source.stem, {})}
    assert slides.apply([copy], spec) == [copy]
    written = copy.read_bytes()
    assert slides.apply([copy], spec) == [] and copy.read_bytes() == written
    assert slides.disagreements([copy], spec) == []
    after = json.loads(written)
    for before_cell, after_cell in zip(nb["cells"], after["cells"], strict=True):
        after_cell["metadata"].pop("slideshow")
        assert before_cell == after_cell
    assert after["metadata"].pop("rise") == slides.RISE_OPTIONS
    assert after["metadata"] == nb["metadata"]
