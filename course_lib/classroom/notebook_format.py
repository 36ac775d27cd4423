"""Notebooks stored byte for byte as JupyterLab saves them.

When JupyterLab saves a notebook (Ctrl+S, or RISE's Alt+R, which saves before it opens the deck),
the browser sends the whole document to the server as JSON text made by JavaScript's
``JSON.stringify``, and the server parses it with Python's ``json`` and writes it with
``nbformat.write``: indent 1, keys sorted, ``ensure_ascii=False``, multi-line strings split into
lists of lines, a final newline. The one thing that trip changes is numbers. JavaScript has a
single number type and writes a float with an integral value without a fraction (``6.0`` becomes
``6``), which Python then reads back as an ``int``; every other finite float comes back as the
same float. ipywidgets stores slider bounds and values as floats (``"max": 6.0``), so a notebook
written by nbformat alone is rewritten (``"max": 6``) on its first save in JupyterLab, and a
teacher's checkout is modified by opening a deck.

:func:`write_notebook` writes what that trip gives, so that JupyterLab's save changes nothing;
``course_lib.teaching.execute`` and ``course_lib.classroom.slides`` write notebooks with it, and
``tests/test_notebook_format.py`` checks every committed notebook.

    python -m course_lib.classroom.notebook_format notebooks/*.ipynb   # rewrite in that form
"""

from __future__ import annotations

import json
import math
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

__all__ = ["javascript_number", "through_javascript", "jupyterlab_text", "write_notebook"]

# Integers beyond this are not all exactly representable as JavaScript numbers (doubles).
_EXACT_INTEGERS = 2**53


def javascript_number(value: float) -> str:
    """``String(value)`` in JavaScript (Number.prototype.toString, radix 10), which is also
    what ``JSON.stringify`` writes for a finite number.

    The digits are the shortest that read back as the same double (the same digits Python's
    ``repr`` chooses); the form depends on the decimal exponent: plain digits, without ``.0``,
    up to 1e21 (exclusive); exponent form from 1e21 on and below 1e-6 (``1e+21``, ``1.5e-7``).
    """
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(
            f"javascript_number: {value!r} has no JSON form (JSON.stringify writes null)"
        )
    if value == 0.0:
        return "0"  # String(-0) is "0" too
    sign = "-" if value < 0 else ""
    _, digit_tuple, exponent = Decimal(repr(abs(value))).as_tuple()
    digits = "".join(map(str, digit_tuple)).rstrip("0")
    exponent += len(digit_tuple) - len(digits)  # the trailing zeros dropped
    # value = 0.<digits> * 10**point, in the standard's terms: s = digits, k = len(s), n = point
    k, point = len(digits), len(digits) + exponent
    if k <= point <= 21:
        text = digits + "0" * (point - k)
    elif 0 < point <= 21:
        text = digits[:point] + "." + digits[point:]
    elif -6 < point <= 0:
        text = "0." + "0" * (-point) + digits
    else:
        power = point - 1
        mantissa = digits if k == 1 else digits[0] + "." + digits[1:]
        text = f"{mantissa}e{'+' if power >= 0 else '-'}{abs(power)}"
    return sign + text


def _number_through_javascript(value: int | float) -> int | float | None:
    if isinstance(value, int) and abs(value) <= _EXACT_INTEGERS:
        return value
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON.stringify(NaN) and JSON.stringify(Infinity) are null
    return json.loads(javascript_number(float(value)))


def through_javascript(value: Any) -> Any:
    """`value` (JSON data) as the server reads it back after ``JSON.stringify`` in the browser:
    every number replaced by what Python's ``json`` reads from JavaScript's text for it (an
    integral float below 1e21 becomes an ``int``; other floats are unchanged)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return _number_through_javascript(value)
    if isinstance(value, dict):
        return {key: through_javascript(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [through_javascript(item) for item in value]
    raise TypeError(f"through_javascript: {type(value).__name__} is not JSON data")


def jupyterlab_text(nb) -> str:
    """The text JupyterLab's save writes for notebook `nb` (an nbformat notebook or a dict)."""
    import nbformat

    node = nbformat.from_dict(through_javascript(nb))
    text = nbformat.writes(node, version=nbformat.NO_CONVERT)
    return text if text.endswith("\n") else text + "\n"


def write_notebook(nb, path: str | Path) -> None:
    """Write `nb` to `path` exactly as JupyterLab's save would (UTF-8)."""
    Path(path).write_text(jupyterlab_text(nb), encoding="utf-8")


def _rewrite(paths: list[str]) -> None:
    import nbformat

    for path in paths:
        before = Path(path).read_text(encoding="utf-8")
        text = jupyterlab_text(nbformat.reads(before, as_version=nbformat.NO_CONVERT))
        if text != before:
            Path(path).write_text(text, encoding="utf-8")
            print(f"rewrote {path}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m course_lib.classroom.notebook_format NOTEBOOK.ipynb [...]")
    _rewrite(sys.argv[1:])
