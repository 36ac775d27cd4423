"""The course map: the path through the chapters, what each assumes, its goals and its time.

    python -m course_lib.classroom.course_map          # rewrite README's course map section
    python -m course_lib.classroom.course_map --print  # print it instead

The same map opens the static site (:mod:`course_lib.classroom.site`). What each chapter assumes
and its goals are written here by hand; the times come from the notebooks:

* **run time**: measured, the CPU time of a Run All on a 2-core CPU
  (``notebooks/guides/timings.json``, written by ``python -m course_lib.classroom.timings``, which
  says why CPU time and not wall-clock time on a shared machine);
* **reading and exercises**: an *estimate*, computed from the notebook: its prose at
  :data:`WORDS_PER_MINUTE` words a minute (slow, for text with formulas), plus
  :data:`MINUTES_PER_EXERCISE` per exercise and :data:`MINUTES_PER_EXPLORER` per explorer, rounded
  up to 5 minutes. No learner was timed.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from course_lib.classroom.timings import read_timings
from course_lib.readme_sections import markers, replace_section, section

REPO_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO_ROOT / "notebooks"
README = REPO_ROOT / "README.md"
SECTION = "course map"
START, END = markers(SECTION)
WORDS_PER_MINUTE = 100
MINUTES_PER_EXERCISE = 10
MINUTES_PER_EXPLORER = 5
EXPLORER_CALL = re.compile(r"\binteract(?:ive)?\s*\(")
# "**Exercise 2.**" in prose or "## 9. Exercise 2: ..." as a heading
EXERCISE = re.compile(r"^(?:\*\*|#+ [^\n]*?)Exercise (\d+)", re.M)

__all__ = ["CHAPTERS", "Chapter", "chapter_times", "render", "write_readme"]


@dataclass(frozen=True)
class Chapter:
    stem: str  # the notebook's file name without .ipynb
    title: str
    assumes: tuple[str, ...]  # chapter numbers a learner should have done first
    goals: str  # one line; the notebook's first cell lists them in full

    @property
    def number(self) -> str:
        return self.stem.split("_", 1)[0]


CHAPTERS = (
    Chapter("00_permutation_invariance", "Attention has no idea where a token is", (),
            "attention from scratch; without positions it is permutation-equivariant; a causal "
            "mask is itself a position signal"),
    Chapter("01_sinusoidal", "Sinusoidal positions", ("00",),
            "the sin/cos table from its formula; a shift is a fixed rotation; where the code is "
            "added, and why scores stay absolute"),
    Chapter("01b_flash_attention", "Flash attention in one page", ("00",),
            "tiles and the online softmax; merging partial states; the kernel every later swap "
            "uses (skippable on a first pass)"),
    Chapter("02_learned", "Learned positions", ("01",),
            "a trainable table, its cost, what it learns, what happens past its last row"),
    Chapter("03_rope", "RoPE", ("01",),
            "rotating q and k; the relative property; the two channel layouts; positions "
            "when decoding with a cache"),
    Chapter("04_exposb", "ExpoSB", ("03",),
            "RoPE plus an amplitude, a band gain and a distance factor, each tested against the "
            "report's claims"),
    Chapter("05_stick_breaking", "Stick-breaking attention and RSE", ("03",),
            "weights from a stick broken nearest key first, in log space; RSE's learned distance "
            "penalty"),
    Chapter("06_score_biases", "Score biases: ALiBi and T5", ("01", "03"),
            "a bias on the score is relative by construction; ALiBi's slopes; T5's buckets; "
            "KERPLE's learned kernel of the distance; trained at 64, read at 512"),
    Chapter("07_rope_scaling", "Longer than trained: scaling RoPE", ("03", "05", "06"),
            "why RoPE breaks past its training length; PI, NTK-aware, dynamic NTK and YaRN; "
            "a cache with dynamic scaling; xPos, a decay built into RoPE"),
    Chapter("08_positions_from_content", "Positions from content: FoX and CoPE", ("03", "05"),
            "a forget gate on the scores; positions that count; three running sums over the "
            "keys between i and j"),
    Chapter("09_two_dimensions", "Positions in two dimensions", ("02", "03"),
            "axial 2D RoPE and the 2-D shift test; RoPE-Mixed, LieRE and ComRoPE (AP, LD); a "
            "tiny ViT per encoding"),
    Chapter("10_bert_comparison", "The BERT comparison", ("02", "03", "04", "05"),
            "every encoding on MLM and CLM over five seeds; paired t-tests with Holm's correction; probes"),
    Chapter("11_your_own_encoding", "Your own encoding", ("01", "06", "10"),
            "an encoding as one file; Sandwich from its formula; the conformance report; FIRE, a "
            "bias that reads the query's position; a live five-seed comparison"),
)  # fmt: skip

PATHS = """\
* **Core path**: 00 → 01 → 02 → 03. Take 01b before the first kernel swap you want to read
  closely; every chapter has a section that swaps in a kernel that 01b explains.
* **The implementation report's encodings**: 04 and 05, in either order, after 03.
* **06-09**: 06 needs 01 and 03 (its experiment trains sinusoidal and RoPE models). 07 needs
  06 and 05: its experiment sets ALiBi and stick-breaking beside the scaled RoPEs. 08 needs 05
  (FoX and CoPE are read as relatives of the stick) and 03, not 06 or 07. 09 needs only 02 and
  03. So: 06 before 07; 08 and 09 any time after their prerequisites, in any order.
* **10** reads the results of every encoding: take it after the others; it refers back to 00, 02,
  04, 05 and 07, and reads the others' rows without needing their chapters.
* **11**, the capstone, comes last: its learner writes an encoding of their own, using the
  sinusoids of 01, the score biases of 06 and the paired comparison of 10."""


def _notebook(stem: str) -> dict:
    return json.loads((NOTEBOOKS / f"{stem}.ipynb").read_text())


def chapter_times(stem: str, timings: dict | None = None) -> dict:
    """``{"cpu_s": measured CPU seconds of a Run All, "estimate_min": reading + exercises +
    explorers, "exercises", "explorers"}``."""
    timings = read_timings() if timings is None else timings
    if stem not in timings["notebooks"]:
        raise KeyError(
            f"no measured run time for {stem}: run `python -m course_lib.classroom.timings`"
        )
    cells = _notebook(stem)["cells"]
    prose = " ".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    exercises = len(
        {
            n
            for c in cells
            if c["cell_type"] == "markdown"
            for n in EXERCISE.findall("".join(c["source"]))
        }
    )
    explorers = sum(
        1 for c in cells if c["cell_type"] == "code" and EXPLORER_CALL.search("".join(c["source"]))
    )
    minutes = (
        len(prose.split()) / WORDS_PER_MINUTE
        + exercises * MINUTES_PER_EXERCISE
        + explorers * MINUTES_PER_EXPLORER
    )
    return {
        "cpu_s": timings["notebooks"][stem]["cpu_s"],
        "estimate_min": 5 * math.ceil(minutes / 5),
        "exercises": exercises,
        "explorers": explorers,
    }


def _run_time(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def render(link_prefix: str = "notebooks/", suffix: str = ".ipynb") -> str:
    """The course map as Markdown. Links are ``<link_prefix><stem><suffix>``."""
    timings = read_timings()
    rows = []
    for chapter in CHAPTERS:
        t = chapter_times(chapter.stem, timings)
        link = f"[{chapter.title}]({link_prefix}{chapter.stem}{suffix})"
        assumes = ", ".join(chapter.assumes) or "PyTorch basics"
        rows.append(
            f"| {chapter.number} | {link} | {assumes} | {chapter.goals} | "
            f"{_run_time(t['cpu_s'])} | ~{t['estimate_min']} min |"
        )
    machine = timings["machine"]
    return "\n".join(
        [
            "| # | chapter | assumes | goals | Run All, CPU time (measured) | reading and exercises "
            "(estimate) |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
            PATHS,
            "",
            textwrap.fill(
                f"*Run All*: the CPU time of the notebook's kernel for a Run All on a "
                f"{machine['cpu_cores']}-core CPU without a GPU, the lowest of the runs of "
                f"`python -m course_lib.classroom.timings` ({machine['measured']}). The machine "
                "was shared, which stretches wall-clock time far more than CPU time; on an idle "
                "machine a Run All takes about this long or less (PyTorch uses both cores in "
                "places). *Reading and exercises*: an estimate, not a measurement: the notebook's "
                f"prose at {WORDS_PER_MINUTE} words a minute, {MINUTES_PER_EXERCISE} minutes per "
                f"exercise, {MINUTES_PER_EXPLORER} per explorer, rounded up to 5 minutes.",
                width=100,
            ),
        ]
    )


def readme_section() -> str:
    return section(SECTION, render())


def write_readme() -> bool:
    """Replace README's course map section; returns whether it changed."""
    return replace_section(SECTION, render(), README)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print the map, change nothing")
    args = parser.parse_args(argv)
    if args.print:
        print(render())
    else:
        print("README.md updated" if write_readme() else "README.md already up to date")


if __name__ == "__main__":
    main()
