"""A scratch package for encodings a learner writes in a notebook (chapter 11).

An encoding is one file that registers itself when imported (CONTRIBUTING, "Add an encoding").
:func:`write_encoding` writes such a file into a package of its own in a scratch folder (never
into the installed ``course_lib``) and imports it, so the registry, ``get_attention_class``, the
conformance checks and the kernels see it exactly as they would see a file of the library. Running
the cell again replaces the previous version: its record is unregistered and the file re-imported.
"""

from __future__ import annotations

import importlib
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from course_lib.registry import REGISTRY, unregister

__all__ = ["SCRATCH_PACKAGE", "scratch_folder", "write_encoding"]

#: The package the files go into: ``import my_encodings.<name>``.
SCRATCH_PACKAGE = "my_encodings"

_FOLDER: list[Path] = []


def scratch_folder() -> Path:
    """The folder that holds :data:`SCRATCH_PACKAGE` (a temporary one per Python process, put on
    ``sys.path`` once)."""
    if not _FOLDER:
        folder = Path(tempfile.mkdtemp(prefix="course-scratch-"))
        (folder / SCRATCH_PACKAGE).mkdir()
        (folder / SCRATCH_PACKAGE / "__init__.py").write_text('"""Encodings written by hand."""\n')
        sys.path.insert(0, str(folder))
        _FOLDER.append(folder)
    return _FOLDER[0]


def write_encoding(name: str, source: str) -> ModuleType:
    """Write ``source`` to ``my_encodings/<name>.py`` in the scratch folder and import it.

    ``name`` must be a Python identifier (the file's name; by convention the encoding's). Every
    encoding the file registered before (an earlier run of the same cell) is unregistered first,
    so the new version replaces it. Returns the imported module; an error in the file is raised
    as Python raises it (with the file's line numbers)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name must be a Python identifier (the file's name), got {name!r}")
    if not isinstance(source, str) or "register(" not in source:
        raise ValueError("source must be the text of an encoding file that calls register(...)")
    path = scratch_folder() / SCRATCH_PACKAGE / f"{name}.py"
    module_name = f"{SCRATCH_PACKAGE}.{name}"
    previous = sys.modules.pop(module_name, None)
    if previous is not None:
        for encoding in list(REGISTRY.values()):
            if encoding.module.__module__ == module_name:
                unregister(encoding.name)
    path.write_text(source)
    importlib.invalidate_caches()
    return importlib.import_module(module_name)
