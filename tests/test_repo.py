"""The repository keeps its promises: CI runs the README's test command, links resolve."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    return re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), flags=re.S)


def test_ci_runs_the_readme_test_command():
    test_command = next(c for c in readme_commands() if c.rstrip().endswith("-m pytest"))
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_command.strip() in ci_lines


def test_readme_links_to_existing_notebooks_in_order():
    links = re.findall(r"\]\((notebooks/[^)]+\.ipynb)\)", (ROOT / "README.md").read_text())
    assert links == sorted(links) and len(links) >= 7
    for link in links:
        assert (ROOT / link).exists(), link


def test_readme_lists_every_notebook():
    linked = set(re.findall(r"\]\((notebooks/[^)]+\.ipynb)\)", (ROOT / "README.md").read_text()))
    on_disk = {f"notebooks/{p.name}" for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert on_disk <= linked, sorted(on_disk - linked)


def test_pyproject_ships_every_package():
    """A regular (non-editable) install ships only the packages pyproject.toml lists."""
    text = (ROOT / "pyproject.toml").read_text()
    listed = set(re.findall(r'"(course_lib[\w.]*)"', text.split("[tool.setuptools]")[1]))
    packages = {
        ".".join(("course_lib", *p.parent.relative_to(ROOT / "course_lib").parts))
        for p in (ROOT / "course_lib").rglob("__init__.py")
    }
    packages |= {"course_lib.kernels"}
    assert packages <= listed, sorted(packages - listed)


def test_requirements_use_floors_not_pins():
    lines = [
        line.split("#")[0].split(";")[0].strip()
        for line in (ROOT / "requirements.txt").read_text().splitlines()
    ]
    for line in filter(None, lines):
        assert "==" not in line, line


def test_the_triton_floor_is_the_one_the_runtime_checks():
    """requirements.txt, pyproject.toml and ``course_lib.runtime.TRITON_MINIMUM`` name the same
    oldest Triton (the runtime refuses an older one with a message, where an import would fail)."""
    from course_lib.runtime import TRITON_MINIMUM

    floor = "triton>={}.{}".format(*TRITON_MINIMUM)
    for name in ("requirements.txt", "pyproject.toml"):
        found = re.findall(r"triton>=[\d.]+", (ROOT / name).read_text())
        assert found == [floor], (name, found, floor)


def test_ci_runs_the_notebooks_again_with_the_portable_cpu_kernels():
    """CONTRIBUTING, "Notebooks": verdicts must hold whatever CPU kernels PyTorch picks, so CI
    runs every notebook under nbval a second time with ATEN_CPU_CAPABILITY=default (and avx512
    where the CPU has it but PyTorch chose less)."""
    ci = (ROOT / ".ci" / "run").read_text()
    readme_run = ci.index(".venv/bin/python -m pytest\n")
    again = ci.index('ATEN_CPU_CAPABILITY="$setting" .venv/bin/python -m pytest notebooks/')
    assert readme_run < again
    assert 'settings="default"' in ci and 'settings="$settings avx512"' in ci
    assert ci.index("unset ATEN_CPU_CAPABILITY") < readme_run
    contributing = (ROOT / "CONTRIBUTING.md").read_text()
    assert "ATEN_CPU_CAPABILITY" in contributing.split("## Notebooks", 1)[1].split("\n## ", 1)[0]
