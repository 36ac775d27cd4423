"""What a trained run of the comparison is scored on, and its results file
(:func:`evaluate_and_save`):

* the loss at the training length on every test window (masked LM: several mask draws), per
  window, so the report can bootstrap the test text's own noise
  (:func:`course_lib.evaluate.heldout_loss`);
* past the training length, position and context apart, on the same targets
  (:func:`course_lib.evaluate.shift_and_context_losses`);
* the word-order and retrieval probes (:func:`course_lib.train.probe_finetune`) with several
  fine-tune seeds, candidates in a random order, ties wrong, standard errors over word-order
  pairs (:func:`retrieval_bag_baseline`: the best a model blind to positions can do on
  retrieval);
* the values the encoding's modules report (``reported_values``: RSE's lambda per head) with the
  range the optimiser could have reached (``reachable_values``);
* cost: parameters, training seconds, CPU seconds (as measured during the run, on a machine that
  may be busy: :func:`course_lib.compare.timing.timing_pass` measures speed on its own).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from course_lib.compare.arms import Arm
from course_lib.compare.common import (
    ComparisonText,
    hardware_description,
    load_average,
    write_result,
)
from course_lib.compare.presets import Preset
from course_lib.compare.results import hardware_label, run_name
from course_lib.data import ProbeBatch
from course_lib.distributed import Processes
from course_lib.evaluate import heldout_loss, peak_memory, shift_and_context_losses
from course_lib.model import MiniBert
from course_lib.train import TrainState, learning_rate_sum, probe_finetune

__all__ = ["evaluate_and_save", "retrieval_bag_baseline"]


def retrieval_bag_baseline(probe: ProbeBatch) -> float:
    """Expected accuracy of the best guess that ignores positions on a retrieval probe: one of
    the most frequent context symbols, picked at random (a bag of symbols knows counts, not
    places). It is above ``1 / len(alphabet)`` because the target is always in the context."""
    context_len = probe.texts[0].index("@")  # "<context>@<p>?<answer>"
    total = 0.0
    for row, answer in zip(probe.input_ids[:, :context_len], probe.answer_id.tolist(), strict=True):
        counts = torch.bincount(row, minlength=256)
        top = counts.max()
        if counts[answer] == top:
            total += 1.0 / int((counts == top).sum())
    return total / len(probe)


def _binned_accuracy(correct: list[float], positions: list[int]) -> dict:
    """Accuracy per target position: ``{"position": [...], "accuracy": [...], "count": [...]}``
    (``correct``: 0/1 per example and fine-tune, ``positions`` alongside)."""
    table: dict[int, list[float]] = {}
    for ok, pos in zip(correct, positions, strict=True):
        table.setdefault(pos, [0.0, 0])
        table[pos][0] += float(ok)
        table[pos][1] += 1
    keys = sorted(table)
    return {
        "position": keys,
        "accuracy": [table[k][0] / table[k][1] for k in keys],
        "count": [table[k][1] for k in keys],
    }


def _probe_entry(spec, eval_probe: ProbeBatch, outcomes: list[dict]) -> dict:
    """One probe's results over its fine-tunes: the accuracy over every (example, fine-tune),
    per unit (word-order pair, or example) the number right, the standard error over units
    (``sd(unit accuracy) / sqrt(units)``, the fine-tunes averaged within a unit), and each
    fine-tune's accuracy."""
    size, tunes = spec.unit_size, len(outcomes)
    examples = len(eval_probe)
    right = [sum(int(o["correct"][i]) for o in outcomes) for i in range(examples)]
    unit_correct = [sum(right[u * size : (u + 1) * size]) for u in range(examples // size)]
    unit_accuracy = [c / (size * tunes) for c in unit_correct]
    entry = {
        "accuracy": sum(unit_correct) / (size * tunes * len(unit_correct)),
        "standard_error": statistics.stdev(unit_accuracy) / math.sqrt(len(unit_accuracy)),
        "standard_error_over": "word-order pairs" if size == 2 else "examples",
        "finetune_seeds": list(spec.finetune_seeds),
        "finetune_accuracies": [o["accuracy"] for o in outcomes],
        "chance": spec.chance,
        "eval_examples": examples,
        "final_train_loss": [o["final_train_loss"] for o in outcomes],
        "by_position": _binned_accuracy(
            [float(c) for o in outcomes for c in o["correct"]],
            eval_probe.target_position.tolist() * tunes,
        ),
        "unit_correct": unit_correct,
        "unit_count": [size * tunes] * len(unit_correct),
    }
    if spec.task == "retrieval":
        entry["bag_of_symbols_baseline"] = retrieval_bag_baseline(eval_probe)
    if spec.task == "word_order":
        both = [
            sum(o["correct"][i] and o["correct"][i + 1] for i in range(0, examples - 1, 2))
            / (examples // 2)
            for o in outcomes
        ]
        entry["pairs_both_right"] = statistics.fmean(both)
    return entry


def evaluate_and_save(
    model: MiniBert,
    state: TrainState,
    device: torch.device,
    arm_spec: Arm,
    objective: str,
    seed: int,
    learning_rate: float,
    preset: Preset,
    identity: dict,
    data: ComparisonText,
    result_path: Path,
    progress: bool,
    started: tuple[float, float],
    processes: Processes | None,
) -> dict:
    """Evaluate the trained ``model`` (test loss, position and context, probes, learned values)
    and write its results file."""
    arm = arm_spec.name
    name = run_name(objective, arm, seed)
    config = preset.train_config(objective, seed, learning_rate)
    common = dict(
        mask_prob=config.mask_prob, batch_size=preset.eval_batch_size,
        autocast_dtype=config.autocast_dtype,
    )  # fmt: skip
    evaluation = {
        "val": heldout_loss(
            model, data.test, mask_draws=preset.mask_draws, mask_seed=config.mask_seed, **common
        ),
        **shift_and_context_losses(
            model,
            data.long,
            config.seq_len,
            preset.offsets,
            mask_draws=preset.long_mask_draws,
            mask_seed=config.mask_seed + 1,
            **common,
        ),
    }
    evaluated = time.perf_counter()
    probes = {}
    for spec in preset.probes:
        if objective not in spec.objectives:
            continue
        train_probe, eval_probe = spec.make("train"), spec.make("eval")
        outcomes = [
            probe_finetune(
                model,
                train_probe,
                eval_probe,
                replace(spec.finetune, seed=tune_seed),
                autocast_dtype=config.autocast_dtype,
                progress=progress,
                desc=f"{name} {spec.task} (fine-tune {tune_seed})",
            )  # fmt: skip
            for tune_seed in spec.finetune_seeds
        ]
        probes[spec.task] = _probe_entry(spec, eval_probe, outcomes)
    probed = time.perf_counter()
    hardware = hardware_description(device, processes)
    movement = learning_rate_sum(config)
    learned, reach = {}, {}
    for i, layer in enumerate(model.layers):
        if values := layer.attention.reported_values():
            learned[f"layer{i}"] = values
            reachable = getattr(layer.attention, "reachable_values", None)
            if reachable is not None and (ranges := reachable(movement)):
                reach[f"layer{i}"] = {k: list(v) for k, v in ranges.items()}
    tokens_trained = config.steps * config.batch_size * config.seq_len
    val = evaluation["val"]
    result = {
        "identity": identity,
        "run": name,
        "arm": arm,
        "encoding": arm_spec.encoding,
        "seed": seed,
        "objective": objective,
        "learning_rate": float(learning_rate),
        "preset": preset.name,
        "preset_description": preset.description,
        "label": f"{preset.name} preset, {hardware_label(hardware)}",
        "hardware": hardware,
        "data": data.describe(),
        "curves": {"train": state.train_curve, "val": state.val_curve},
        "metrics": {
            "final_val_loss": val["loss"],
            "final_val_bits_per_byte": val["loss"] / math.log(2.0),
            "final_val_tokens": val["tokens"],
            "loss_note": (
                "nats per predicted byte token on the test split; for mlm over the masked tokens "
                "of every mask draw"
            ),
            "tokens_trained": tokens_trained,
            "train_seconds": state.train_seconds,
            "train_cpu_seconds": state.train_cpu_seconds,
            "tokens_per_second_during_run": tokens_trained / state.train_seconds,
            "training_segments": state.segments,
            **(
                {"training_processes": state.processes}
                if any(n > 1 for n in state.processes)
                else {}
            ),
            "evaluation_seconds": evaluated - started[0] - state.train_seconds,
            "probe_seconds": probed - evaluated,
            "wall_seconds_this_segment": probed - started[0],
            "cpu_seconds_this_segment": time.process_time() - started[1],
            "cpu_load_average_1min": load_average(),
            "peak_memory": peak_memory(device),
            "parameters": model.parameter_counts(),
            "learning_rate_sum": movement,
        },
        "evaluation": evaluation,
        "probes": probes,
        "learned_values": learned,
        "reachable_values": reach,
    }
    write_result(result_path, result)
    return result
