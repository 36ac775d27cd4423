"""Bad input to the comparison gets a clear error: its command line, and damaged or foreign
results files and checkpoints (each error names the file and the way out: --force, or delete
it). One test per cause; the runs that train stop after one step."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

from course_lib.compare import load_results, main, run_one, write_report
from course_lib.compare.files import ComparisonFileError, read_result
from course_lib.train import CheckpointError, load_checkpoint

TINY = ["--preset", "tiny", "--no-progress", "--seeds", "0"]


def exits_with(capsys, argv: list[str]) -> str:
    """Run the command line, expect exit status 2, return what it printed on stderr."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "Traceback" not in error
    return error


DAMAGED_RESULTS = {
    "empty": ("", "is empty"),
    "cut short": ('{"identity": {"format_version": 2}, "run": "clm_none', "is not valid JSON"),
    "garbage": ("not json at all", "is not valid JSON"),
    "a list": ("[1, 2]", "holds a JSON list, not a run's results"),
    "keys missing": ('{"identity": {"format_version": 2}}', "lacks run, arm, encoding"),
}


@pytest.mark.parametrize("kind", DAMAGED_RESULTS)
def test_a_damaged_results_file_is_named_with_the_way_out(tmp_path, capsys, kind):
    content, problem = DAMAGED_RESULTS[kind]
    path = tmp_path / "clm_none_s0.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ComparisonFileError, match=f"{path}.* {problem}.*--force.*delete"):
        run_one("none", "clm", "tiny", out_dir=tmp_path, progress=False)
    argv = [*TINY, "--encodings", "none", "--objectives", "clm", "--out", str(tmp_path)]
    error = exits_with(capsys, argv)
    assert str(path) in error and problem in error and "--force" in error
    error = exits_with(capsys, ["--preset", "tiny", "--report", "--out", str(tmp_path)])
    assert str(path) in error and problem in error
    with pytest.raises(ComparisonFileError, match=problem):
        load_results(tmp_path)


def _checkpoint_bytes() -> bytes:
    buffer = io.BytesIO()
    torch.save({"model": {"w": torch.zeros(64, 64)}, "state": {"step": 3}}, buffer)
    return buffer.getvalue()


DAMAGED_CHECKPOINTS = {
    "empty": (b"", "cannot be read"),
    "cut short": (_checkpoint_bytes()[:3000], "cannot be read"),
    "garbage": (b"not a checkpoint", "cannot be read"),
    "something else": (_checkpoint_bytes(), "is not one this course wrote"),
}


@pytest.mark.parametrize("kind", DAMAGED_CHECKPOINTS)
def test_a_damaged_checkpoint_is_named_with_the_way_out(tmp_path, kind):
    content, problem = DAMAGED_CHECKPOINTS[kind]
    path = tmp_path / "run.pt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=f"checkpoint {path} {problem}.*delete it.*--force"):
        load_checkpoint(path)


def test_the_command_line_reports_a_damaged_checkpoint(tmp_path, capsys):
    path = tmp_path / "checkpoints" / "clm_none_s0.pt"
    path.parent.mkdir()
    path.write_bytes(b"")
    argv = [*TINY, "--encodings", "none", "--objectives", "clm", "--out", str(tmp_path)]
    error = exits_with(capsys, argv)
    assert f"checkpoint {path} cannot be read" in error and "--force" in error


def test_force_recomputes_over_damaged_files_and_a_causal_only_encoding_is_named(tmp_path, capsys):
    (tmp_path / "mlm_none_s0.json").write_text("{", encoding="utf-8")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "mlm_none_s0.pt").write_bytes(b"garbage")
    argv = [*TINY, "--encodings", "none", "fox", "--objectives", "mlm", "--out", str(tmp_path)]
    assert main([*argv, "--force", "--stop-after-steps", "1"]) == 0
    assert "fox: causal only, so no mlm run" in capsys.readouterr().err
    assert load_checkpoint(tmp_path / "checkpoints" / "mlm_none_s0.pt")["state"]["step"] == 1
    assert not (tmp_path / "mlm_none_s0.json").exists()


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--stop-after-steps", "0", "--stop-after-steps: must be an integer >= 1, got '0'"),
        ("--stop-after-steps", "-5", "--stop-after-steps: must be an integer >= 1, got '-5'"),
        ("--stop-after-steps", "2.5", "--stop-after-steps: must be an integer >= 1"),
        ("--threads", "0", "--threads: must be an integer >= 1, got '0'"),
        ("--dist-timeout", "nan", "--dist-timeout: must be a finite number of seconds > 0"),
        ("--dist-timeout", "inf", "--dist-timeout: must be a finite number of seconds > 0"),
        ("--dist-timeout", "0", "--dist-timeout: must be a finite number of seconds > 0"),
        ("--dist-timeout", "-1", "--dist-timeout: must be a finite number of seconds > 0"),
        ("--out", "", "--out/--out-dir: is empty; give a folder name"),
        ("--out", "  ", "--out/--out-dir: is empty; give a folder name"),
        ("--checkpoint-dir", "", "--checkpoint-dir: is empty; give a folder name"),
    ],
)
def test_numbers_and_folder_names_are_checked(capsys, option, value, message):
    assert message in exits_with(capsys, [*TINY, option, value])


def test_an_output_folder_cannot_be_a_file_or_inside_one(tmp_path, capsys):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a folder", encoding="utf-8")
    for option in ("--out", "--checkpoint-dir"):
        error = exits_with(capsys, [*TINY, option, str(a_file / "results")])
        assert f"{a_file} is a file, not a folder" in error and f"choose another {option}" in error
        error = exits_with(capsys, [*TINY, option, str(a_file)])
        assert f"{a_file} is a file, not a folder" in error
    assert "is a file" in exits_with(capsys, ["--preset", "tiny", "--report", "--out", str(a_file)])


@pytest.mark.parametrize("extra", [[], ["--ablations", "none"]])
def test_a_selection_with_no_run_says_why(capsys, extra):
    error = exits_with(capsys, [*TINY, "--encodings", "fox", "cope", "--objectives", "mlm", *extra])
    assert "nothing to run: fox, cope are causal only, so they have no mlm run" in error
    assert "Add clm to --objectives" in error


def _foreign_result(path: Path) -> None:
    """A well-formed results file whose identity is no preset's."""
    result = {
        "identity": {"format_version": 2, "preset": "elsewhere"},
        "run": "clm_none_s0",
        "arm": "none",
        "encoding": "none",
        "seed": 0,
        "objective": "clm",
        "metrics": {},
    }
    path.write_text(json.dumps(result), encoding="utf-8")


def test_a_report_of_a_folder_without_runs_of_the_preset_says_so(tmp_path, capsys):
    error = exits_with(capsys, ["--preset", "tiny", "--report", "--out", str(tmp_path)])
    assert "no runs of preset 'tiny'" in error and "it holds no results files" in error
    error = exits_with(capsys, ["--preset", "tiny", "--report", "--out", str(tmp_path / "x")])
    assert "there is no such folder" in error
    _foreign_result(tmp_path / "clm_none_s0.json")
    assert read_result(tmp_path / "clm_none_s0.json")["arm"] == "none"
    error = exits_with(capsys, ["--preset", "tiny", "--report", "--out", str(tmp_path)])
    assert "its 1 results file(s) were made with another configuration" in error
    assert "--preset tiny --out" in error
    with pytest.raises(ComparisonFileError, match="no runs of preset 'tiny'"):
        write_report(tmp_path, "tiny")
