"""Every number a teacher's guide quotes is one its notebook prints.

A guide (`notebooks/guides/NN_name.md`) is read next to its notebook, so a number in it that the
notebook no longer prints sends a teacher into class with a stale result. The rule:

* **What counts.** Every number written in digits in the guide's text, after the title line,
  with these left out: formulas and names (`$...$` maths and inline code), references
  (the numbers after "section", "notebook", "chapter", "exercise", "pair" and "Assumes", with the
  lists and ranges that follow them: "sections 1-3 and 5-6", "notebooks 01-06"), the numbered
  list markers, and dimension names ("2D", "1-D").
* **What it is checked against.** The numbers the committed notebook prints: the text outputs
  (streams, and the plain, markdown and HTML forms of displayed values) of the cells nbval
  compares, signs dropped. Cells tagged `nbval-ignore-output` (timings, devices, widgets, a
  retrained model's details) print what another run need not repeat, so a guide never quotes
  them. A quoted
  number matches a printed one when rounding the printed number (half up) to the quoted number's
  decimals gives the quoted number, and the printed number has at least that many decimals: a
  guide may round what the notebook prints ("about 1.4" for 1.44), never add a digit to it. A
  percentage matches a printed percentage the same way, or a printed fraction read as a
  percentage (0.712 is 71.2%, so "about 71%" matches it). "1,179,648" is 1179648.
* **Otherwise** the number must be in `NOT_RESULTS` below, for that guide, with the reason it is
  not a result: a constant of a formula, a size the text sets, a hypothetical in a question.

A guide may quote no number at all. The check is as strong as the quoted digits: a one-digit
integer proves little, so a guide quotes a measured value with the digits the notebook prints.
"""

import json
import re
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
GUIDES = sorted((REPO_ROOT / "notebooks" / "guides").glob("*.md"))

# guide stem -> {number as the guide writes it: why it is not a result of the notebook}
NOT_RESULTS: dict[str, dict[str, str]] = {
    "00_permutation_invariance": {
        "180": "the angle a figure's weight matrix is turned by, a description of the figure",
        "500": "a position a discussion question asks about",
        "501": "a position a discussion question asks about",
    },
    "03_rope": {
        "4000": "a position a discussion question asks about",
        "90": "the length of a class, advice to the teacher",
    },
    "04_exposb": {
        "2000": "a setting of the explorer the teacher is asked to try",
    },
    "07_rope_scaling": {
        "26": "chance on the retrieval probe is 1/26: one of the 26 letters, set by the task",
    },
    "10_bert_comparison": {
        "32": "the length of the strings the split deduplicates, set by the data",
        "0.5": "a coin's probability in the formula 2 x 0.5^n",
        "50%": "2 x 0.5^2, the formula's value with 2 seeds",
        "25%": "2 x 0.5^3, the formula's value with 3 seeds",
        "6%": "2 x 0.5^5 = 6.25%, the formula's value with 5 seeds",
        "95%": "the confidence level of the intervals, a setting",
        "120k": "the model's size, set by the preset (about 120 thousand parameters)",
    },
}

_HIDDEN = re.compile(r"\$\$.*?\$\$|\$[^$]*\$|`[^`]*`", re.S)
_REFERENCE = re.compile(
    r"\b(?:[Ss]ections?|[Nn]otebooks?|[Cc]hapters?|[Ee]xercises?|[Pp]airs?|[Aa]ssumes)"
    r"\s+\d+[a-z]?(?:\s*(?:-|,|and|or)\s*\d+[a-z]?)*"
)
_LIST_MARKER = re.compile(r"^\s*\d+\.\s", re.M)
_DIMENSION = re.compile(r"\b\d-?D\b")
# a number: not inside a word or another number ("50..57" is two numbers, "1.44" one)
_QUOTED = re.compile(r"(?<![\w,])(?<!\d\.)(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?k?)(?!\w|\.\d)(\s*%)?")
_PRINTED = re.compile(r"(?<!\w)(?<!\d\.)(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)(?!\d|\.\d)(%)?")


def quoted_numbers(text: str) -> list[tuple[str, str]]:
    """``[(number as written, context)]`` of the numbers a guide's text quotes."""
    text = text.split("\n", 1)[1] if "\n" in text else ""
    for pattern in (_HIDDEN, _REFERENCE, _LIST_MARKER, _DIMENSION):
        text = pattern.sub(" ", text)
    found = []
    for match in _QUOTED.finditer(text):
        written = match.group(1) + ("%" if match.group(2) else "")
        context = " ".join(text[max(0, match.start() - 40) : match.end() + 30].split())
        found.append((written, context))
    return found


def printed_text(notebook: dict) -> str:
    parts = []
    for cell in notebook["cells"]:
        if "nbval-ignore-output" in cell.get("metadata", {}).get("tags", []):
            continue  # timings, devices, widgets: not the same on every run
        for output in cell.get("outputs", []):
            if "text" in output:
                parts.append("".join(output["text"]))
            for kind in ("text/plain", "text/markdown", "text/html"):
                if kind in output.get("data", {}):
                    parts.append("".join(output["data"][kind]))
    return "\n".join(parts)


def _value(written: str) -> tuple[Decimal, int]:
    """``(value, decimals)`` of a number as written (thousands separators dropped)."""
    digits = written.replace(",", "")
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    return Decimal(digits), decimals


def printed_numbers(text: str) -> tuple[list[tuple[Decimal, int]], list[tuple[Decimal, int]]]:
    """``(numbers, percentages)`` the text prints, each as ``(value, decimals)``; a fraction
    is also listed among the percentages, times 100 (0.712 as 71.2 with 1 decimal)."""
    numbers, percentages = [], []
    for match in _PRINTED.finditer(text):
        value, decimals = _value(match.group(1))
        if match.group(2):
            percentages.append((value, decimals))
        else:
            numbers.append((value, decimals))
            if decimals >= 2:
                percentages.append((value * 100, decimals - 2))
    return numbers, percentages


def _rounds_to(quoted: tuple[Decimal, int], printed: tuple[Decimal, int]) -> bool:
    (want, places), (value, decimals) = quoted, printed
    if decimals < places:
        return False
    return value.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP) == want


def is_printed(written: str, numbers, percentages) -> bool:
    if written.endswith("k"):
        return False  # "120k" is a rounded size, never printed in that form
    if written.endswith("%"):
        quoted, pool = _value(written[:-1]), percentages
    else:
        quoted, pool = _value(written), numbers
    return any(_rounds_to(quoted, printed) for printed in pool)


def test_the_rule_reads_numbers_as_documented():
    text = (
        "# Guide: 08 · Title 2\n"
        "Sections 1-3 and 5-6, notebooks 01-06, $10^4$, `head_dim 8`, 2-D and 2D RoPE.\n"
        "1. A question: about 1.4 tokens, 74%, 1,179,648 rows, a 120k model, 0.04-0.10, 50..57.\n"
    )
    assert [w for w, _ in quoted_numbers(text)] == [
        "1.4",
        "74%",
        "1,179,648",
        "120k",
        "0.04",
        "0.10",
        "50",
        "57",
    ]
    numbers, percentages = printed_numbers("decay 1.44 tokens, fox 0.712 (0.64-0.75), -1,179,648")
    assert is_printed("1.4", numbers, percentages)
    assert is_printed("1.44", numbers, percentages)
    assert not is_printed("1.440", numbers, percentages)  # a digit the notebook does not print
    assert is_printed("71%", numbers, percentages) and is_printed("71.2%", numbers, percentages)
    assert not is_printed("74%", numbers, percentages)
    assert is_printed("1,179,648", numbers, percentages)
    assert not is_printed("1.5", numbers, percentages)  # 1.44 rounds to 1.4
    numbers, percentages = printed_numbers("up to 29.6%, shape (2, 4, 12), tokens 50..57")
    assert is_printed("30%", numbers, percentages) and is_printed("12", numbers, percentages)
    assert is_printed("50", numbers, percentages) and is_printed("57", numbers, percentages)
    ignored = {"metadata": {"tags": ["nbval-ignore-output"]}, "outputs": [{"text": "0.74"}]}
    compared = {"metadata": {}, "outputs": [{"text": "0.712"}]}
    assert printed_text({"cells": [ignored, compared]}) == "0.712"


@pytest.mark.parametrize("guide", GUIDES, ids=[g.stem for g in GUIDES])
def test_every_number_a_guide_quotes_is_printed_by_its_notebook(guide):
    notebook = guide.parent.parent / f"{guide.stem}.ipynb"
    numbers, percentages = printed_numbers(printed_text(json.loads(notebook.read_text())))
    allowed = NOT_RESULTS.get(guide.stem, {})
    quoted = quoted_numbers(guide.read_text())
    stale = [
        f"{written!r} in '... {context} ...'"
        for written, context in quoted
        if written not in allowed and not is_printed(written, numbers, percentages)
    ]
    assert not stale, (
        f"{guide.name} quotes numbers that {notebook.name} does not print (quote what its "
        "outputs print, remove the number, or list it in NOT_RESULTS with the reason it is not "
        "a result):\n  " + "\n  ".join(stale)
    )
    unused = set(allowed) - {written for written, _ in quoted}
    assert not unused, f"NOT_RESULTS lists numbers {guide.name} no longer quotes: {unused}"
