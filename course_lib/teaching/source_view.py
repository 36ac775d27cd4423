"""Show the learner the source of a Triton kernel, read from its file (its module is not imported).

Reading the file rather than importing the module means the listing works on every machine,
including those where Triton cannot be installed.
"""

from __future__ import annotations

import ast
import importlib.util
import textwrap
from pathlib import Path

__all__ = ["kernel_source", "source_excerpt", "show_source"]


def kernel_source(module: str, function: str) -> str:
    """The source text (decorators included) of ``function`` in ``course_lib.kernels.<module>``,
    or, for a dotted ``module`` such as ``"encodings.kerple"``, in ``course_lib.<module>`` (an
    encoding's own kernel hooks, defined under its Triton guard, are found too)."""
    name = f"course_lib.{module}" if "." in module else f"course_lib.kernels.{module}"
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise ValueError(f"no module {name}")
    text = Path(spec.origin).read_text()
    lines = text.splitlines()
    functions = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef)]
    for node in functions:
        if node.name == function:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            return textwrap.dedent("\n".join(lines[first - 1 : node.end_lineno]))
    names = sorted({n.name for n in functions})
    raise ValueError(f"{name} has no function {function!r}; it has {names}")


def source_excerpt(source: str, start: str, end: str) -> str:
    """The lines of ``source`` from the first containing ``start`` to the next containing ``end``."""
    lines = source.splitlines()
    try:
        first = next(i for i, line in enumerate(lines) if start in line)
        last = next(i for i in range(first, len(lines)) if end in lines[i])
    except StopIteration:
        raise ValueError(f"no lines from {start!r} to {end!r} in the source") from None
    return "\n".join(lines[first : last + 1])


def show_source(
    module: str, function: str, start: str | None = None, end: str | None = None
) -> None:
    """Print ``function`` of ``course_lib.kernels.<module>`` (see :func:`kernel_source`), or the
    excerpt of it from the first line containing ``start`` to the next line containing ``end``
    (both given, or neither)."""
    if (start is None) != (end is None):
        raise ValueError("give both start and end for an excerpt, or neither for the function")
    source = kernel_source(module, function)
    if start is not None:
        source = source_excerpt(source, start, end)
    print(source)
