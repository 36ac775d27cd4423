"""The notebooks' helpers (course_lib.teaching): where figures go, the kernel-swap checks, the
source viewer, the notebook runner, and the layout rule that the core never imports them."""

import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch

from course_lib.classroom.notebook_format import jupyterlab_text
from course_lib.teaching import kernel_swap, notebook
from course_lib.teaching.execute import KERNELSPEC, execute_notebooks
from course_lib.teaching.source_view import kernel_source, show_source

ROOT = Path(__file__).resolve().parent.parent


# -- printed bounds -------------------------------------------------------------------------


def test_bounds_on_a_grid_round_outward_and_keep_the_step_decimals():
    assert notebook.at_least(0.9794, 0.05) == notebook.at_least(0.9897, 0.05) == "0.95"
    # a value on the grid moves one step out: 0 on one CPU and 3e-4 on another print alike
    assert notebook.at_least(0.95, 0.05) == "0.90" and notebook.at_least(1.0, 0.05) == "0.95"
    assert notebook.at_most(0.0, 0.005) == notebook.at_most(0.0003, 0.005) == "0.005"
    assert notebook.at_most(0.0846, 0.05) == "0.10" and notebook.at_most(0.1, 0.05) == "0.15"
    assert notebook.at_least(3.4, 1.5) == notebook.at_least(4.18, 1.5) == "3.0"
    assert notebook.at_least(0.5545, 0.25) == "0.50" and notebook.at_most(0.0009, 0.005) == "0.005"
    assert notebook.at_most(-0.001, 0.1) == "0.0"  # never "-0.0"


# -- where figures go -----------------------------------------------------------------------


def test_figures_go_outside_the_checkout_unless_a_folder_is_configured(monkeypatch, tmp_path):
    monkeypatch.delenv("COURSE_OUTPUT_DIR", raising=False)
    default = notebook.output_dir().resolve()
    assert ROOT.resolve() not in default.parents and default != ROOT.resolve()
    monkeypatch.setenv("COURSE_OUTPUT_DIR", str(tmp_path / "figs"))
    assert notebook.output_dir() == tmp_path / "figs"
    assert (tmp_path / "figs").is_dir()


def test_save_figure_of_a_learner_run_leaves_committed_figures_alone(monkeypatch, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.delenv("COURSE_OUTPUT_DIR", raising=False)
    monkeypatch.setenv("COURSE_SOLUTIONS", "0")
    monkeypatch.setattr(notebook, "learner_output_dir", lambda: tmp_path / "learner")
    committed = ROOT / "figures" / "00_permuted_attention.png"
    before = committed.read_bytes() if committed.exists() else None
    fig, _ = plt.subplots()
    path = notebook.save_figure(fig, "00_permuted_attention.png")
    plt.close(fig)
    assert path == tmp_path / "learner" / "00_permuted_attention.png" and path.exists()
    assert (committed.read_bytes() if committed.exists() else None) == before


def test_exercise_uses_the_solution_only_when_asked(monkeypatch, capsys):
    def mine():
        return "mine"

    def worked():
        return "worked"

    monkeypatch.setenv("COURSE_SOLUTIONS", "0")
    assert notebook.exercise(mine, worked) is mine
    monkeypatch.setenv("COURSE_SOLUTIONS", "1")
    assert notebook.exercise(mine, worked) is worked
    assert "worked solution" in capsys.readouterr().out


def test_report_check_prints_a_verdict(capsys):
    assert notebook.report_check("f", []) is True
    assert notebook.report_check("f", ["wrong at 3"]) is False
    out = capsys.readouterr().out
    assert "✓ f: correct" in out and "wrong at 3" in out


def test_report_check_says_how_many_problems_it_left_out(capsys):
    assert notebook.report_check("f", [f"wrong at {i}" for i in range(11)]) is False
    out = capsys.readouterr().out
    assert "11 problem(s)" in out and "wrong at 4" in out and "wrong at 5" not in out
    assert out.rstrip().endswith("... and 6 more")
    notebook.report_check("f", [f"wrong at {i}" for i in range(5)])
    assert "more" not in capsys.readouterr().out


# -- agree and time_ms ------------------------------------------------------------------------


def _linear_run(offset_on_triton: float):
    """A run whose "triton" side differs from the reference by ``offset`` in its output."""
    torch.manual_seed(0)
    x = torch.randn(3, 4, requires_grad=True)
    w = torch.randn(4, 4, requires_grad=True)

    def run(backend):
        out = x @ w
        return out + offset_on_triton if backend == "triton" else out

    return run, {"x": x, "w": w}


def test_agree_passes_prints_one_line_and_compares_gradients(monkeypatch, capsys):
    monkeypatch.setattr(kernel_swap, "kernels_available", lambda: True)
    run, wrt = _linear_run(0.0)
    assert kernel_swap.agree("toy", run, wrt=wrt) is None
    out = capsys.readouterr().out.strip().splitlines()
    line = "toy: kernel == reference (output and gradients of x, w; atol 1e-04, rtol 1e-04)"
    assert out == [line]


def test_agree_raises_on_a_wrong_output(monkeypatch):
    monkeypatch.setattr(kernel_swap, "kernels_available", lambda: True)
    run, wrt = _linear_run(1e-2)
    with pytest.raises(AssertionError, match="disagrees with the reference on output"):
        kernel_swap.agree("toy", run, wrt=wrt)


def test_agree_raises_on_a_wrong_gradient(monkeypatch):
    monkeypatch.setattr(kernel_swap, "kernels_available", lambda: True)
    torch.manual_seed(0)
    x = torch.randn(5, requires_grad=True)

    def run(backend):  # same value, different gradient on the triton side
        return x * 2 if backend == "reference" else x.detach() * 2 + (x - x.detach()) * 3

    with pytest.raises(AssertionError, match="dx"):
        kernel_swap.agree("toy", run, wrt={"x": x})


def test_agree_compares_tensors_the_run_returns_itself(monkeypatch):
    monkeypatch.setattr(kernel_swap, "kernels_available", lambda: True)
    x = torch.randn(2, 3)

    def run(backend):
        torch.manual_seed(0)
        layer = torch.nn.Linear(3, 3)
        if backend == "triton":
            with torch.no_grad():
                layer.bias.add_(1.0)
        return layer(x), dict(layer.named_parameters())

    with pytest.raises(AssertionError, match="output"):
        kernel_swap.agree("layer", run)


def test_agree_substitutes_nothing_where_kernels_cannot_run(monkeypatch, capsys):
    monkeypatch.setattr(kernel_swap, "kernels_available", lambda: False)
    monkeypatch.setattr(kernel_swap, "unavailable_brief", lambda: "Triton 3.3.1 is too old")
    calls = []
    assert kernel_swap.agree("toy", lambda backend: calls.append(backend)) is None
    assert calls == []
    out = capsys.readouterr().out
    assert "kernel not run (Triton 3.3.1 is too old)" in out and "nothing is substituted" in out


def test_time_ms_does_not_time_without_a_gpu(monkeypatch):
    monkeypatch.setattr(kernel_swap, "timings_available", lambda: False)
    calls = []
    with pytest.raises(RuntimeError, match="Timings need a GPU"):
        kernel_swap.time_ms(lambda: calls.append(1))
    assert calls == []


# -- the source viewer ------------------------------------------------------------------------


def test_show_source_prints_a_kernel_function_and_an_excerpt(capsys):
    full = kernel_source("flash", "_flash_fwd_kernel")
    assert full.startswith("@triton.jit") and "def _flash_fwd_kernel(" in full
    show_source("flash", "_flash_fwd_kernel", "def _flash_fwd_kernel(", "def _flash_fwd_kernel(")
    assert capsys.readouterr().out.strip() == "def _flash_fwd_kernel("
    with pytest.raises(ValueError, match="has no function"):
        kernel_source("flash", "no_such_kernel")
    with pytest.raises(ValueError, match="both start and end"):
        show_source("flash", "_flash_fwd_kernel", start="x")
    # an encoding's own hook, defined (indented) under its Triton guard, is found and dedented
    hook = kernel_source("encodings.kerple", "kerple_log_grad")
    assert hook.startswith("@triton.jit\ndef kerple_log_grad(") and "_add_sums(" in hook
    with pytest.raises(ValueError, match="no module course_lib.encodings.nothing"):
        kernel_source("encodings.nothing", "f")


def test_show_source_reads_the_file_without_importing_the_kernel_module():
    # (course_lib itself may import Triton for the kernels' shared helpers; the listing must not
    # need the module it shows, so it works where that module cannot be imported)
    code = (
        "import sys\n"
        "from course_lib.teaching.source_view import show_source\n"
        "show_source('flash', '_flash_fwd_kernel')\n"
        "assert 'course_lib.kernels.flash' not in sys.modules, 'the kernel module was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# -- the runner and the notebooks ---------------------------------------------------------------


def test_execute_runs_with_solutions_writes_figures_to_the_repo_and_saves_as_jupyterlab(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("COURSE_OUTPUT_DIR", str(tmp_path / "elsewhere"))
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "import os\nprint(os.environ['COURSE_SOLUTIONS'], os.environ['COURSE_OUTPUT_DIR'])"
        )
    ]
    nb.metadata["kernelspec"] = {
        "display_name": "Python 3",
        "language": "python",
        "name": "python3",
    }
    # a slider's saved state, as ipywidgets gives it (floats); JupyterLab saves "max": 6
    widget = {"state": {"max": 6.0, "step": 0.5}}
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {"w": widget}}}
    path = tmp_path / "tiny.ipynb"
    nbformat.write(nb, path)
    execute_notebooks([str(path)], timeout=120)
    done = nbformat.read(path, as_version=4)
    assert done.cells[0].outputs[0]["text"].split() == ["1", str(ROOT / "figures")]
    assert done.metadata["kernelspec"] == KERNELSPEC
    written = path.read_text(encoding="utf-8")
    assert written == jupyterlab_text(done) and '"max": 6,' in written
    # the runner leaves the calling process's environment as it was
    import os

    assert os.environ["COURSE_OUTPUT_DIR"] == str(tmp_path / "elsewhere")


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_notebooks_are_stored_with_jupyterlabs_kernelspec(path):
    metadata = json.loads(path.read_text())["metadata"]
    assert metadata.get("kernelspec") == KERNELSPEC


def test_the_core_never_imports_the_teaching_package():
    offenders = []
    for file in sorted((ROOT / "course_lib").rglob("*.py")):
        if "teaching" in file.relative_to(ROOT / "course_lib").parts:
            continue
        if re.search(r"^\s*(from|import)\s+course_lib\.teaching", file.read_text(), flags=re.M):
            offenders.append(str(file.relative_to(ROOT)))
    assert offenders == []


# -- verdicts over seeds --------------------------------------------------------------------


@pytest.mark.parametrize(("level", "n", "table"), [(0.95, 5, 2.776445), (0.99, 3, 9.924843)])
def test_paired_intervals_use_the_t_quantiles_of_the_tables(level, n, table):
    from course_lib.teaching.seed_verdicts import PairedDifference

    diff = PairedDifference(tuple(float(i) for i in range(n)), level)
    assert diff.half_width == pytest.approx(table * diff.sd / n**0.5, rel=1e-6)


def test_seed_claims_correct_for_the_family_and_decide_by_the_interval(capsys):
    from course_lib.teaching.seed_verdicts import SeedClaims

    one, many = SeedClaims(family=1), SeedClaims(family=20)
    a, b = [1.0, 1.2, 0.9, 1.1, 1.05], [0.5, 0.6, 0.55, 0.5, 0.45]
    wide = many.paired(a, b)
    narrow = one.paired(a, b)
    assert narrow.level == 0.95 and wide.level == pytest.approx(0.9975)
    assert wide.mean == pytest.approx(narrow.mean) and wide.half_width > narrow.half_width
    # by hand: mean 0.53, sd of the differences, t_{0.975, 4} = 2.776445
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    sd = (sum((d - 0.53) ** 2 for d in diffs) / 4) ** 0.5
    assert narrow.half_width == pytest.approx(2.776445 * sd / 5**0.5, rel=1e-6)
    assert one.expect("a - b", a, b, "higher", margin=0.3).verdict(0.3) == "higher"
    assert "a - b: +0.530" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="the text says 'lower'"):
        many.expect("a - b", a, b, "lower")
    noisy = [0.1, -0.2, 0.15, -0.05, 0.0]
    many.expect("noise", noisy, [0.0] * 5, "within noise")
    many.expect("equivalent", noisy, [0.0] * 5, "within", margin=0.5)
    with pytest.raises(AssertionError):
        many.expect("not equivalent at 0.1", noisy, [0.0] * 5, "within", margin=0.1)
    # a positive mean whose interval still reaches 0 is noise, not "higher" (nor "lower")
    leaning = [0.3, -0.1, 0.25, 0.05, 0.1]
    assert one.paired(leaning, [0.0] * 5).mean > 0 and one.paired(leaning, [0.0] * 5).low < 0
    assert one.paired(leaning, [0.0] * 5).verdict() == "within noise"
    assert one.paired([0.0] * 5, leaning).verdict() == "within noise"
    with pytest.raises(AssertionError):
        one.expect("leaning", leaning, [0.0] * 5, "higher")
    many.expect_every_seed("all positive", a, lambda v: v > 0)
    with pytest.raises(AssertionError, match="every seed"):
        many.expect_every_seed("all above 1", a, lambda v: v > 1)


def test_seed_claims_refuse_bad_input_and_more_claims_than_the_family():
    from course_lib.teaching.seed_verdicts import SeedClaims

    with pytest.raises(ValueError, match="family"):
        SeedClaims(family=0)
    claims = SeedClaims(family=1)
    with pytest.raises(ValueError, match="at least 2"):
        claims.paired([1.0], [0.0])
    with pytest.raises(ValueError, match="unknown verdict"):
        claims.expect("x", [1, 2], [0, 0], "better")
    with pytest.raises(ValueError, match="needs a margin"):
        claims.expect("x", [1, 2], [0, 0], "within")
    claims.expect("x", [1.0, 1.1], [0.0, 0.0], "higher")
    with pytest.raises(AssertionError, match="raise the family size"):
        claims.expect("y", [1.0, 1.1], [0.0, 0.0], "higher")
    claims.expect_every_seed("per seed", [1.0, 2.0], lambda v: v > 0)  # no share of the family
    assert claims.summary().startswith("1 of 1 claims checked with intervals")
    assert claims.summary().endswith("1 statements checked in every seed")


# -- notebook 08's counting task ----------------------------------------------------------------


def test_counting_targets_are_the_word_k_words_back():
    from course_lib.teaching.counting_task import CountingTaskConfig, counting_batch, target_index

    config = CountingTaskConfig()
    ids, targets = counting_batch(torch.Generator().manual_seed(3), 8, 32, config)
    source = target_index(ids, targets, config)
    has = targets != -100
    assert torch.equal(source >= 0, has)
    assert torch.equal(ids.gather(1, source.clamp(min=0))[has], targets[has])
    for b in range(2):  # by hand: the words before each position, fillers skipped
        words = [(t, int(x)) for t, x in enumerate(ids[b]) if x != config.filler]
        for n, (t, _) in enumerate(words):
            want = words[n - config.k][0] if n >= config.k else -1
            assert int(source[b, t]) == want


def test_gate_probe_of_a_cope_model_counts_at_the_target():
    from course_lib.teaching.counting_task import (
        CountingTaskConfig,
        gate_probe,
        train_counting_model,
    )

    config = CountingTaskConfig(steps=5)
    run = train_counting_model("cope", config)
    heads = gate_probe(run.model, config)["heads"]
    assert len(heads) == config.num_heads
    for head in heads:
        low, high = head["count_at_target_range"]
        assert 0 <= low <= head["count_at_target"] <= high <= config.npos - 1
        assert 0 < head["attention_at_target"] < 1
