"""Committed notebooks are stored as JupyterLab saves them
(``course_lib.classroom.notebook_format``), so that saving a notebook in JupyterLab, or opening its
deck (RISE saves first), changes no byte.

The expected number texts below are written by hand from ECMAScript's Number::toString (what
``String(x)`` and ``JSON.stringify`` give): the shortest digits that read back as the same double;
no fraction for an integral value; plain digits for 1e-6 <= |x| < 1e21, exponent form otherwise
(``1e+21``, ``1.5e-7``). tests/test_browser.py saves the notebooks in a real JupyterLab and
compares bytes.
"""

from __future__ import annotations

import difflib
import json
import math
import re
import shutil
from pathlib import Path

import nbformat
import pytest
from hypothesis import given
from hypothesis import strategies as st

from course_lib.classroom import slides
from course_lib.classroom.notebook_format import (
    javascript_number,
    jupyterlab_text,
    through_javascript,
)

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

# (Python float, what JavaScript's String(x) gives)
JAVASCRIPT_TEXTS = [
    (6.0, "6"),
    (-6.0, "-6"),
    (10000.0, "10000"),
    (0.0, "0"),
    (-0.0, "0"),
    (0.5, "0.5"),
    (-1.25, "-1.25"),
    (100.5, "100.5"),
    (0.1, "0.1"),
    (0.1 + 0.2, "0.30000000000000004"),
    (1 / 3, "0.3333333333333333"),
    (0.000123, "0.000123"),
    (1e-05, "0.00001"),
    (1e-06, "0.000001"),
    (1e-07, "1e-7"),
    (-1e-07, "-1e-7"),
    (1.5e-07, "1.5e-7"),
    (1.23e-18, "1.23e-18"),
    (5e-324, "5e-324"),
    (2.0**53, "9007199254740992"),
    (1e20, "100000000000000000000"),
    (1.2345678901234568e20, "123456789012345680000"),
    (1e21, "1e+21"),
    (1.5e300, "1.5e+300"),
    (1.7976931348623157e308, "1.7976931348623157e+308"),
]


@pytest.mark.parametrize(("value", "text"), JAVASCRIPT_TEXTS, ids=[t for _, t in JAVASCRIPT_TEXTS])
def test_numbers_are_written_as_javascript_writes_them(value, text):
    assert javascript_number(value) == text


def test_numbers_without_a_json_form_are_refused():
    for value in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError, match="JSON.stringify writes null"):
            javascript_number(value)


_PLAIN = re.compile(r"-?(0|[1-9]\d*)(\.\d*[1-9])?")
_EXPONENT = re.compile(r"-?[1-9](\.\d*[1-9])?e[+-][1-9]\d*")


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_every_finite_float_reads_back_the_same_in_its_javascript_form(value):
    text = javascript_number(value)
    assert float(text) == value
    assert len(re.sub(r"e.*|[-.]", "", text).strip("0")) <= 17  # shortest: at most 17 digits
    if value == 0 or 1e-6 <= abs(value) < 1e21:
        assert _PLAIN.fullmatch(text), text
    else:
        assert _EXPONENT.fullmatch(text), text


def test_the_trip_through_javascript_turns_integral_floats_into_integers_and_keeps_the_rest():
    state = {
        "max": 6.0, "min": -6.0, "step": 0.5, "value": 10000.0, "tiny": 1e-05, "huge": 1e21,
        "count": 3, "flag": True, "off": False, "none": None, "text": "6.0",
        "list": [1.0, 2.5, [0.0]], "beyond": 2**53 + 1, "nan": math.nan, "inf": -math.inf,
    }  # fmt: skip
    after = through_javascript(state)
    assert after == {
        "max": 6, "min": -6, "step": 0.5, "value": 10000, "tiny": 1e-05, "huge": 1e21,
        "count": 3, "flag": True, "off": False, "none": None, "text": "6.0",
        "list": [1, 2.5, [0]], "beyond": 2**53, "nan": None, "inf": None,
    }  # fmt: skip
    for key in ("max", "min", "value", "beyond"):
        assert type(after[key]) is int, key
    for key in ("step", "tiny", "huge"):
        assert type(after[key]) is float, key  # JavaScript writes 1e+21: Python reads a float
    assert after["flag"] is True and after["off"] is False
    assert through_javascript(state) == after and state["max"] == 6.0  # the input is untouched
    with pytest.raises(TypeError, match="set is not JSON data"):
        through_javascript({"x": {1}})


def test_the_text_is_nbformat_json_with_javascript_numbers_and_a_final_newline():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Café\n\nline two", id="cell-0")]
    nb.metadata["widgets"] = {
        "application/vnd.jupyter.widget-state+json": {
            "state": {"m": {"state": {"value": 10000.0, "max": 6.0, "step": 1e-05}}},
            "version_major": 2,
            "version_minor": 0,
        }
    }
    text = jupyterlab_text(nb)
    assert text.startswith('{\n "cells": [\n  {\n   "cell_type": "markdown",\n')
    assert text.endswith("}\n") and not text.endswith("\n\n")
    assert '"source": [\n    "# Café\\n",\n    "\\n",\n    "line two"\n   ]' in text
    # keys sorted, numbers as the server writes what it read from the browser
    assert '"state": {\n       "max": 6,\n       "step": 1e-05,\n       "value": 10000\n' in text
    assert jupyterlab_text(nbformat.reads(text, as_version=nbformat.NO_CONVERT)) == text


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_notebooks_are_stored_as_jupyterlab_saves_them(notebook):
    stored = notebook.read_text(encoding="utf-8")
    saved = jupyterlab_text(nbformat.reads(stored, as_version=nbformat.NO_CONVERT))
    if saved != stored:
        diff = difflib.unified_diff(
            stored.splitlines(), saved.splitlines(), "committed", "as JupyterLab saves", lineterm=""
        )
        shown = "\n".join(list(diff)[:40])
        pytest.fail(
            f"{notebook.name} is not stored as JupyterLab saves it, so saving it (or opening its "
            "deck) modifies the checkout; rewrite it with `python -m "
            f"course_lib.classroom.notebook_format notebooks/{notebook.name}`:\n{shown}"
        )


def test_the_slide_plan_writes_notebooks_as_jupyterlab_saves_them(tmp_path):
    source = ROOT / "notebooks" / "03_rope.ipynb"
    nb = json.loads(source.read_text(encoding="utf-8"))
    nb["cells"][0]["metadata"].pop("slideshow", None)
    states = nb["metadata"]["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    slider = next(s["state"] for s in states.values() if isinstance(s["state"].get("max"), int))
    slider["max"] = float(slider["max"])  # as ipywidgets leaves it and nbformat writes it
    copy = tmp_path / source.name
    copy.write_text(json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    assert slides.apply([copy], {source.stem: slides.load_spec().get(source.stem, {})}) == [copy]
    assert copy.read_text(encoding="utf-8") == source.read_text(encoding="utf-8")


def test_the_rewriting_command_leaves_a_notebook_in_that_form_alone(tmp_path, capsys):
    from course_lib.classroom.notebook_format import _rewrite

    copy = tmp_path / "03_rope.ipynb"
    shutil.copy(ROOT / "notebooks" / "03_rope.ipynb", copy)
    written = copy.read_bytes()
    _rewrite([str(copy)])
    assert copy.read_bytes() == written and capsys.readouterr().out == ""
    copy.write_text(copy.read_text(encoding="utf-8").replace('"max": 6,', '"max": 6.0,'))
    _rewrite([str(copy)])
    assert copy.read_bytes() == written and "rewrote" in capsys.readouterr().out


_SLIDERS = {"FloatLogSliderModel", "FloatSliderModel", "IntSliderModel"}


def _off_grid_sliders(notebook: Path) -> list[str]:
    """The sliders of ``notebook``'s saved widget state whose value is not ``min + k step``
    (for a log slider, in the exponent: ``log_base(value) = min + k step``)."""
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    states = nb["metadata"].get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    problems = []
    for model in states.get("state", {}).values():
        if model.get("model_name") not in _SLIDERS:
            continue
        s = model["state"]
        log = model["model_name"] == "FloatLogSliderModel"
        step = s.get("step", 0.1 if model["model_name"] != "IntSliderModel" else 1)
        x = math.log(s["value"], s.get("base", 10)) if log else s["value"]
        k = (x - s["min"]) / step
        if abs(k - round(k)) > 1e-6:
            on = "exponent " if log else ""
            problems.append(
                f"slider {s.get('description')!r}: value {s['value']} ({on}{x:.6g}) is not "
                f"min {s['min']} + a multiple of step {step}"
            )
    return problems


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_explorer_sliders_start_on_their_grid(notebook):
    """A slider's value off its grid is snapped by the browser when the widget is drawn, and the
    snapped value is sent back: the explorer runs again, during Run All while later cells run,
    and its figure shows the snapped value (0.501 for 0.5) instead of the code's."""
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    states = nb["metadata"].get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    has_explorer = any("interact(" in "".join(c["source"]) for c in nb["cells"])
    assert not has_explorer or states.get("state"), (
        f"{notebook.name} has an explorer but no saved widget state to check"
    )
    problems = _off_grid_sliders(notebook)
    assert not problems, f"{notebook.name}: " + "; ".join(problems)
