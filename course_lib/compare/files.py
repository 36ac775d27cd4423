"""Reading the comparison's files back, and the folders it writes to, with errors that help.

A results file that cannot be read (cut short by a full disk, emptied, overwritten by something
else), an output folder that is a file, a report asked of a folder with no runs of the preset:
each raises a :class:`ComparisonFileError` that names the file or folder, says what is wrong with
it and how to get past it (``--force`` recomputes a run and rewrites its files; or delete the
file; or point ``--out`` elsewhere). The command line prints it without a traceback.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

__all__ = [
    "RESULT_KEYS",
    "ComparisonFileError",
    "check_output_folder",
    "no_runs_message",
    "read_json",
    "read_result",
    "check_result",
]

#: What every results file holds at its top level (see :func:`course_lib.compare.run_one`).
RESULT_KEYS = ("identity", "run", "arm", "encoding", "seed", "objective", "metrics")

_WAY_OUT = "recompute the run with --force (force=True), which rewrites it, or delete the file"


class ComparisonFileError(ValueError):
    """A file or folder of the comparison that cannot be used as it is (the message says why
    and what to do)."""


def read_json(path: str | Path) -> object:
    """The JSON value in ``path``; a damaged, empty or unreadable file raises a
    :class:`ComparisonFileError` naming it."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ComparisonFileError(
            f"results file {path} cannot be read ({error}); {_WAY_OUT}"
        ) from error
    if not text.strip():
        raise ComparisonFileError(
            f"results file {path} is empty (a write was interrupted?); {_WAY_OUT}"
        )
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ComparisonFileError(
            f"results file {path} is not valid JSON ({error.msg}: line {error.lineno}, column "
            f"{error.colno}; cut short or overwritten?); {_WAY_OUT}"
        ) from error


def check_result(path: str | Path, result: object, keys: tuple[str, ...] = RESULT_KEYS) -> dict:
    """``result`` (read from ``path``) as a results dict: a JSON object holding ``keys``
    (default :data:`RESULT_KEYS`, the current format's), ``identity`` an object; else a
    :class:`ComparisonFileError`."""
    if not isinstance(result, dict):
        raise ComparisonFileError(
            f"results file {path} holds a JSON {type(result).__name__}, not a run's results "
            f"(an object); {_WAY_OUT}"
        )
    missing = [key for key in dict.fromkeys(("identity", *keys)) if key not in result]
    if missing or not isinstance(result["identity"], dict):
        what = f"lacks {', '.join(missing)}" if missing else "has an identity that is no object"
        raise ComparisonFileError(f"results file {path} {what}; {_WAY_OUT}")
    return result


def read_result(path: str | Path) -> dict:
    """A run's results dict from ``path`` (:func:`read_json`, then :func:`check_result`)."""
    return check_result(path, read_json(path))


def check_output_folder(path: str | Path, option: str) -> Path:
    """``path`` as a folder the comparison may create or write into: not an empty name (which
    would be the current folder), not a file, not inside a file, and inside a folder where
    folders can be made (tried by making and removing an empty one in the nearest folder that
    exists: ``/proc`` or a read-only disk refuse). ``option`` names it in messages
    (``"--out"``)."""
    if str(path).strip() == "":
        raise ComparisonFileError(
            f"{option} is empty; give a folder name (an empty one would write into the current "
            "folder)"
        )
    path = Path(path)
    for folder in (path, *path.parents):
        if folder.exists():
            if not folder.is_dir():
                inside = "" if folder == path else f" ({path} would be inside it)"
                raise ComparisonFileError(
                    f"{option} {path}: {folder} is a file, not a folder{inside}; choose another "
                    f"{option}"
                )
            _check_writable(folder, path, option)
            break
    return path


def _check_writable(folder: Path, path: Path, option: str) -> None:
    """Make and remove an empty folder in ``folder`` (the nearest existing one of ``path``)."""
    try:
        probe = Path(tempfile.mkdtemp(prefix=".write-check-", dir=folder))
    except OSError as error:
        where = "" if folder == path else f" (it would be made inside {folder})"
        raise ComparisonFileError(
            f"{option} {path}: the comparison cannot write there{where}: "
            f"{error.strerror or error}; choose another {option}"
        ) from None
    probe.rmdir()


def no_runs_message(out_dir: str | Path, preset: str, files: int) -> str:
    """Why a report of ``preset`` in ``out_dir`` has nothing to draw (``files`` results files
    were found there, none of this preset's configuration), and what to do."""
    out_dir = Path(out_dir)
    found = (
        f"its {files} results file(s) were made with another configuration (another preset, "
        "or an older version of this one)"
        if files
        else "it holds no results files"
        if out_dir.is_dir()
        else "there is no such folder"
    )
    return (
        f"no runs of preset {preset!r} to report in {out_dir}: {found}. Run the comparison into "
        f"it first (python -m course_lib.compare --preset {preset} --out {out_dir}), or pass "
        "the --preset and --out that made the results"
    )
