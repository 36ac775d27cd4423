"""Every exercise check of the notebooks: its worked solution passes, each wrong form of a right
answer (None, a list, a numpy array, another dtype, an extra dimension, a transpose) is refused
with a message instead of an exception, and every exercise a notebook sets has its check listed.

The checks live in ``course_lib/teaching/*_checks.py``; each module lists its exercises in
``EXERCISES`` (:class:`course_lib.teaching.answers.Exercise`). Each module's own test file holds
the wrong answers a learner is likely to write and the hint each one gets.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
from pathlib import Path

import pytest
import torch

import course_lib.teaching
from course_lib.teaching.answers import Exercise, answer_problem, form_problem, value_problem

REPO = Path(__file__).resolve().parents[1]


def _check_modules():
    names = [m.name for m in pkgutil.iter_modules(course_lib.teaching.__path__)]
    return [
        importlib.import_module(f"course_lib.teaching.{name}")
        for name in sorted(names)
        if name.endswith("_checks")
    ]


EXERCISES: list[Exercise] = [e for module in _check_modules() for e in module.EXERCISES]


def test_every_check_module_lists_its_exercises():
    for module in _check_modules():
        assert module.EXERCISES, f"{module.__name__} lists no EXERCISES"
        assert all(isinstance(e, Exercise) for e in module.EXERCISES)
    names = [e.name for e in EXERCISES]
    assert len(names) == len(set(names)), "two exercises share a name"


def test_every_exercise_of_the_notebooks_has_a_listed_check():
    solved = {(e.solution.__module__.rsplit(".", 1)[-1], e.solution.__name__) for e in EXERCISES}
    called = set()
    for path in sorted((REPO / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"])
            for module, name in re.findall(r"exercise\([^,]+,\s*(\w+)\.(\w+)\)", source):
                called.add((path.name, module, name))
    assert called, "no exercise() call found in the notebooks"
    modules = {}
    for path in sorted((REPO / "notebooks").glob("*.ipynb")):
        text = path.read_text()
        for alias_line in re.findall(r"solutions import (\w+)(?: as (\w+))?", text):
            module, alias = alias_line
            modules[(path.name, alias or module)] = module
    missing = []
    for notebook, alias, name in sorted(called):
        module = modules.get((notebook, alias), alias)
        if (module, name) not in solved:
            missing.append(f"{notebook}: {alias}.{name}")
    assert not missing, f"exercises with no listed check: {missing}"


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.name)
def test_the_worked_solution_passes(exercise, capsys):
    assert exercise.run(exercise.solution)
    assert "✓" in capsys.readouterr().out


def _first_tensor(out):
    """The tensor a mutation changes: the answer itself, or the first tensor of a tuple."""
    if isinstance(out, torch.Tensor):
        return out, lambda t: t
    if isinstance(out, tuple):
        for i, item in enumerate(out):
            if isinstance(item, torch.Tensor):
                return item, lambda t, i=i: (*out[:i], t, *out[i + 1 :])
    return None, None


def _other_dtype(t: torch.Tensor) -> torch.Tensor:
    if t.dtype == torch.float64:
        return t.float()
    if t.is_floating_point():
        return t.double()
    return t.float()


MUTATIONS = {
    "none": None,
    "sequence": lambda t: t.tolist(),
    "numpy": lambda t: t.detach().numpy(),
    "dtype": _other_dtype,
    "extra_dim": lambda t: t.unsqueeze(0),
    "transposed": lambda t: t.mT if t.dim() >= 2 and t.shape[-1] != t.shape[-2] else None,
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.name)
def test_a_wrong_form_is_refused_with_a_message(exercise, mutation, capsys):
    if mutation in exercise.accepts:
        pytest.skip(f"{exercise.name} accepts {mutation} on purpose")
    how = MUTATIONS[mutation]
    seen = []

    def answer(*args, **kwargs):
        out = exercise.solution(*args, **kwargs)
        if how is None:
            seen.append(True)
            return None
        tensor, put_back = _first_tensor(out)
        if tensor is None or tensor.dim() == 0:
            return out
        changed = how(tensor)
        if changed is None:
            return out
        seen.append(True)
        return put_back(changed)

    verdict = exercise.run(answer)
    if not seen:
        pytest.skip(f"{mutation} does not change {exercise.name}'s answer")
    out = capsys.readouterr().out
    assert not verdict, f"{exercise.name} passed an answer with its form changed ({mutation})"
    assert "✗" in out


def test_form_problem_names_each_form():
    want = torch.zeros(3, 4, dtype=torch.float64)
    assert form_problem(want.clone(), want) is None
    assert "None" in form_problem(None, want) and "return" in form_problem(None, want)
    assert "list" in form_problem(want.tolist(), want)
    assert "numpy" in form_problem(want.numpy(), want)
    assert "number" in form_problem(1.0, want)
    assert "transposed" in form_problem(want.T.clone(), want)
    assert "size 1" in form_problem(want[None], want)
    assert "broadcast" in form_problem(torch.zeros(3, 3, 4, dtype=torch.float64), torch.zeros(3, 4))
    assert "float32" in form_problem(want.float(), want)
    assert "zeros_like" in form_problem(want.float(), want)
    assert form_problem(want.float(), want, dtype=False) is None
    assert ".long()" in form_problem(torch.zeros(3), torch.zeros(3, dtype=torch.long))
    assert "bool" in form_problem(torch.zeros(3, dtype=torch.bool), torch.zeros(3))


def test_value_problem_names_the_first_entry_that_differs():
    want = torch.arange(6.0).view(2, 3)
    assert value_problem(want.clone(), want) is None
    got = want.clone()
    got[1, 2] = 7.5
    got[1, 0] = float("nan")
    message = value_problem(got, want)
    assert message.startswith("2 of 6 entries differ; at [1, 0]: got nan, expected 3")
    assert "NaN" in message
    nan = torch.tensor([float("nan"), -float("inf")])
    assert value_problem(nan.clone(), nan) is None
    assert value_problem(torch.tensor(1.5), torch.tensor(1.0)) == "got 1.5, expected 1"
    assert answer_problem(None, want).startswith("your function returned None")
    assert answer_problem(got, want).startswith("2 of 6")
