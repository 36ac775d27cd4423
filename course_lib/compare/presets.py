"""The comparison's presets, as data: model size, training budget, seeds, probes and evaluation.

A :class:`Preset` fixes everything that defines a comparison except which runs it makes; a
:class:`ProbeSpec` fixes one probe (task, examples, seeds, fine-tuning budget). :data:`PRESETS`:

* ``gpu``: the implementation report's width and depth (hidden 384, 6 layers, 6 heads of 64)
  at sequence 512 (long enough for position to matter), 400 steps of 32 sequences, Triton
  kernels, bf16 autocast, five seeds and every ablation, a sweep of three rates over two sweep
  seeds. It has never been run whole: its budget below is an ESTIMATE, made to be run in
  slices (``--budget-minutes``) on a GPU lent for minutes at a time.
* ``cpu``: hidden 64, 2 layers, 4 heads of 16, sequence 64, 300 clm / 1000 mlm steps, reference
  attention, one thread per process, a learning rate per encoding from a sweep (four masked,
  five causal rates, the lowest mean over two sweep seeds), five seeds, every ablation under
  the objective its question is about (retrieval probe on clm runs only). Its results are
  committed in ``figures/compare_cpu/``; ``summary.md`` there says how long they took.
* ``tiny``: for tests and live demonstrations (seconds per run), one seed, no ablation, no
  sweep.

What every run is scored on (:class:`Preset`'s evaluation fields, :mod:`course_lib.evaluate`):
the **test** split of :func:`course_lib.data.comparison_splits` (deduplicated against training:
no shared 32-byte string), at the training length (every window, masked-LM losses over
``mask_draws`` mask draws) and in long windows of ``long_multiple`` times it (position shift and
long context apart, :func:`course_lib.evaluate.shift_and_context_losses`); a learning-rate sweep
reads only the **selection** split.

:func:`choose_preset` picks one by name (``"auto"`` = ``gpu`` if CUDA is available, else ``cpu``).
A preset's runs cover every registered sequence encoding unless its ``encodings`` names some,
then its ``ablations`` (:mod:`course_lib.compare.arms`), once per seed in ``seeds``; of its saved
runs, :meth:`Preset.not_run_yet` names the arms that have none yet.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace

import torch

from course_lib.compare.arms import ABLATIONS, Arm, NotRunYet, arms_run, get_arm
from course_lib.compare.results import FORMAT_VERSION
from course_lib.data import VOCAB_SIZE, ProbeBatch, retrieval_probe, word_order_probe
from course_lib.model import OBJECTIVES, BertConfig
from course_lib.registry import sequence_encodings
from course_lib.runtime import gpu_has_bf16
from course_lib.train import ProbeConfig, TrainConfig

__all__ = ["FORMAT_VERSION", "OBJECTIVES", "PRESETS", "Preset", "ProbeSpec", "choose_preset"]


@dataclass(frozen=True)
class ProbeSpec:
    """One probe: which task, how many examples (train / held-out eval, each with its own seed),
    the task's own parameters, and the fine-tuning budget."""

    task: str  # "word_order" | "retrieval"
    train_examples: int
    eval_examples: int
    finetune: ProbeConfig
    train_seed: int = 101
    eval_seed: int = 202
    context_len: int = 8  # retrieval only
    alphabet: str = "abcdefghijklmnopqrstuvwxyz"  # retrieval only
    objectives: tuple[str, ...] = OBJECTIVES  # the runs this probe is applied to
    finetune_seeds: tuple[int, ...] = (0,)  # one fine-tune per seed; accuracy over all of them
    order_seed: int = 303  # seeds the order of each example's candidates

    def _generate(self, n: int, seed: int) -> ProbeBatch:
        if self.task == "word_order":
            probe = word_order_probe(n, seed)
        elif self.task == "retrieval":
            probe = retrieval_probe(n, self.context_len, seed, alphabet=self.alphabet)
        else:
            raise ValueError(f"unknown probe task {self.task!r}; valid: 'word_order', 'retrieval'")
        # the candidates of each example in a random order (seeded), so nothing about the
        # answer is in its place among them
        generator = torch.Generator().manual_seed(self.order_seed * 1_000_003 + seed)
        order = torch.rand(probe.candidate_ids.shape, generator=generator).argsort(dim=1)
        return replace(probe, candidate_ids=probe.candidate_ids.gather(1, order))

    @property
    def unit_size(self) -> int:
        """Examples per unit of the standard error: word-order examples come in pairs (both
        orders of the same words, whose answers are not independent), retrieval ones alone."""
        return 2 if self.task == "word_order" else 1

    def make(self, split: str) -> ProbeBatch:
        """The :class:`~course_lib.data.ProbeBatch` of ``split`` ("train" or "eval").

        Held-out means unseen, and each example counts once: eval examples whose text is a
        training example, or an earlier eval example, are dropped (word-order pairs go
        together, as both orders of a pair are in the same sets), so the eval set may be smaller
        than ``eval_examples`` (word order has only 624 distinct pairs)."""
        if split == "train":
            return self._generate(self.train_examples, self.train_seed)
        if split != "eval":
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        seen = set(self._generate(self.train_examples, self.train_seed).texts)
        probe = self._generate(self.eval_examples, self.eval_seed)
        keep_list = []
        for text in probe.texts:
            keep_list.append(text not in seen)
            seen.add(text)
        if self.unit_size == 2:  # a pair is kept whole or dropped whole
            for i in range(0, len(keep_list) - 1, 2):
                keep_list[i] = keep_list[i + 1] = keep_list[i] and keep_list[i + 1]
        keep = torch.tensor(keep_list)
        return ProbeBatch(
            input_ids=probe.input_ids[keep],
            answer_index=probe.answer_index[keep],
            answer_len=probe.answer_len,
            answer_id=probe.answer_id[keep],
            candidate_ids=probe.candidate_ids[keep],
            target_position=probe.target_position[keep],
            texts=tuple(t for t, k in zip(probe.texts, keep.tolist(), strict=True) if k),
        )

    @property
    def chance(self) -> float:
        """Accuracy of a uniform guess among the candidates."""
        return 0.5 if self.task == "word_order" else 1.0 / len(self.alphabet)

    @property
    def sequence_length(self) -> int:
        """Tokens per example (all examples of a probe have the same length)."""
        sample = replace(self, train_examples=2).make("train")
        return sample.input_ids.shape[1]


@dataclass(frozen=True)
class Preset:
    """Everything that defines a comparison except the list of runs.

    Training: ``train`` (``mlm_steps`` replaces its steps for the masked runs); the learning rate
    of an arm's runs is chosen per encoding from ``learning_rates`` (``mlm_learning_rates`` for
    the masked runs, when given) by a sweep (one run per rate and seed of ``sweep_seeds``,
    scored on the selection split; the lowest mean over those seeds wins:
    :mod:`course_lib.compare.sweep`), or is ``train.learning_rate`` when the grid is empty. Evaluation (on the test split of
    :func:`course_lib.data.comparison_splits` with ``select_fraction``, ``test_fraction`` and
    ``ngram``): every window of the training length (at most ``eval_windows``), masked runs
    over ``mask_draws`` mask draws; windows of ``long_multiple`` times the training length (at
    most ``long_windows``, ``long_mask_draws`` mask draws) for the targets at ``offset_multiples``
    times it (position shift and long context apart) and the loss by position bucket."""

    name: str
    description: str
    device: str  # "cpu" or "cuda"
    hidden_size: int
    num_layers: int
    num_heads: int
    dropout: float
    backend: str
    train: TrainConfig
    probes: tuple[ProbeSpec, ...]
    eval_batch_size: int = 8
    cpu_threads: int | None = None  # torch.set_num_threads on CPU (None: leave as is)
    mlm_steps: int | None = None  # training steps of the mlm runs (None: train.steps)
    encodings: tuple[str, ...] | None = None  # None: every registered encoding
    objectives: tuple[str, ...] = OBJECTIVES
    seeds: tuple[int, ...] = (0,)  # one run per seed (the training seed: init and data order)
    ablations: tuple[str, ...] = ()  # names of course_lib.compare.arms.ABLATIONS to run too
    learning_rates: tuple[float, ...] = ()  # the sweep's rates (empty: train.learning_rate)
    mlm_learning_rates: tuple[float, ...] | None = None  # the mlm runs' (None: learning_rates)
    # the seeds of the sweep's runs (never one of ``seeds``): the rate with the lowest mean over
    # them wins, so that one seed's luck does not choose the rate every scored seed trains at
    sweep_seeds: tuple[int, ...] = (1000,)
    select_fraction: float = 0.06
    test_fraction: float = 0.12
    ngram: int = 32
    eval_windows: int | None = None  # test windows at the training length (None: all)
    mask_draws: int = 4
    long_multiple: int = 8
    long_windows: int | None = None
    long_mask_draws: int = 2
    offset_multiples: tuple[int, ...] = (1, 2, 4, 7)

    def __post_init__(self) -> None:
        for spec in self.probes:
            if spec.sequence_length > self.train.seq_len:
                raise ValueError(
                    f"preset {self.name!r}: {spec.task} probe examples have "
                    f"{spec.sequence_length} tokens, more than the training length "
                    f"{self.train.seq_len} (the learned table would have no rows for them)"
                )
        if not self.sweep_seeds:
            raise ValueError(f"preset {self.name!r}: the sweep needs at least one seed")
        for seed in self.sweep_seeds:
            if seed in self.seeds:
                raise ValueError(
                    f"preset {self.name!r}: the sweep's seed {seed} is one of the seeds the "
                    "report scores; choose another"
                )
        if any(not 0 < m < self.long_multiple for m in self.offset_multiples):
            raise ValueError(
                f"offset_multiples must lie in (0, long_multiple={self.long_multiple}), got "
                f"{self.offset_multiples}"
            )

    def encoding_names(self) -> tuple[str, ...]:
        """The encodings a comparison of this preset trains: ``encodings``, or, when it is None,
        every sequence encoding in :data:`course_lib.encodings.REGISTRY` at the time of the call
        (so an encoding registered later is included; the 2-D ones place image patches), in the
        registry's order."""
        return sequence_encodings() if self.encodings is None else tuple(self.encodings)

    def arm_names(self) -> tuple[str, ...]:
        """The arms a comparison of this preset trains: its encodings, then its ablations."""
        return (*self.encoding_names(), *self.ablations)

    def not_run_yet(self, results: list[dict]) -> tuple[NotRunYet, ...]:
        """The arms of this preset (:meth:`arm_names`) that have no run in ``results`` (its
        saved runs, :func:`course_lib.compare.report.preset_results`): an encoding registered,
        or an ablation added, after the runs were made. Readers of the saved results read the
        arms that were run (:func:`course_lib.compare.arms.arms_run`) and list these, each with
        the command that runs it."""
        run = set(arms_run(results))
        return tuple(NotRunYet(arm, self.name) for arm in self.arm_names() if arm not in run)

    def rates(self, objective: str) -> tuple[float, ...]:
        """The sweep's grid for ``objective``'s runs (empty: no sweep)."""
        if objective == "mlm" and self.mlm_learning_rates is not None:
            return tuple(self.mlm_learning_rates)
        return tuple(self.learning_rates)

    @property
    def swept(self) -> bool:
        """Whether the learning rate is chosen by a sweep (else ``train.learning_rate``)."""
        return any(self.rates(o) for o in self.objectives)

    def train_config(
        self, objective: str, seed: int = 0, learning_rate: float | None = None
    ) -> TrainConfig:
        """The training budget of ``objective``'s runs (the same for every encoding), with the
        training ``seed`` (model init and data order) and ``learning_rate`` (default: the
        preset's ``train.learning_rate``). The validation curve is read on the selection split,
        never on the text a report scores."""
        steps = self.mlm_steps if objective == "mlm" and self.mlm_steps is not None else None
        rate = self.train.learning_rate if learning_rate is None else float(learning_rate)
        return replace(self.train, steps=steps or self.train.steps, seed=seed, learning_rate=rate)

    def model_config(self, arm: str | Arm, objective: str) -> BertConfig:
        """The model of one run of ``arm`` (an encoding, or an ablation of one, by name or
        resolved: :mod:`course_lib.compare.arms`). ``max_position_embeddings`` is the training
        length, so the learned table really has no rows past it."""
        spec = arm if isinstance(arm, Arm) else get_arm(arm)
        return BertConfig(
            vocab_size=VOCAB_SIZE,
            hidden_size=self.hidden_size,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            max_position_embeddings=self.train.seq_len,
            encoding=spec.encoding,
            encoding_options=spec.encoding_options(self.train.seq_len),
            objective=objective,
            dropout=self.dropout,
            backend=self.backend,
        )

    @property
    def offsets(self) -> tuple[int, ...]:
        """Where the far targets start: ``offset_multiples`` times the training length."""
        return tuple(m * self.train.seq_len for m in self.offset_multiples)

    def _text_identity(self) -> dict:
        return {
            "select_fraction": self.select_fraction,
            "test_fraction": self.test_fraction,
            "ngram": self.ngram,
        }

    def _model_identity(self, arm: str | Arm, objective: str) -> dict:
        return {
            k: v for k, v in self.model_config(arm, objective).to_dict().items() if v is not None
        }

    def identity(
        self, arm: str | Arm, objective: str, seed: int = 0, learning_rate: float | None = None
    ) -> dict:
        """What must match for a saved checkpoint or result to count as this run of ``arm`` (by
        name or resolved) (JSON types: tuples become lists, so it compares equal to what a
        results file holds). Model options left at None (``encoding_options``) are not part of
        it."""
        identity = {
            "format_version": FORMAT_VERSION,
            "preset": self.name,
            "arm": arm.name if isinstance(arm, Arm) else arm,
            "seed": seed,
            "model_config": self._model_identity(arm, objective),
            "train_config": asdict(self.train_config(objective, seed, learning_rate)),
            "text": self._text_identity(),
            "probes": [asdict(p) for p in self.probes],
            "evaluation": {
                "eval_windows": self.eval_windows,
                "mask_draws": self.mask_draws,
                "long_multiple": self.long_multiple,
                "long_windows": self.long_windows,
                "long_mask_draws": self.long_mask_draws,
                "offset_multiples": list(self.offset_multiples),
            },
        }
        return json.loads(json.dumps(identity))

    def sweep_identity(
        self, encoding: str, objective: str, learning_rate: float, seed: int
    ) -> dict:
        """What must match for a saved sweep run (``encoding`` at ``learning_rate`` with
        ``seed``, one of ``sweep_seeds``, scored on the selection split) to count as this
        preset's."""
        identity = {
            "format_version": FORMAT_VERSION,
            "preset": self.name,
            "sweep": True,
            "arm": encoding,
            "seed": seed,
            "model_config": self._model_identity(encoding, objective),
            "train_config": asdict(self.train_config(objective, seed, learning_rate)),
            "text": self._text_identity(),
            "mask_draws": self.mask_draws,
        }
        return json.loads(json.dumps(identity))


def _probe_config(steps: int, batch_size: int, learning_rate: float) -> ProbeConfig:
    return ProbeConfig(
        steps=steps,
        batch_size=batch_size,
        learning_rate=learning_rate,
        warmup_steps=max(1, steps // 20),
    )


#: The ablations every full preset runs.
_ALL_ABLATIONS = tuple(a.name for a in ABLATIONS)

PRESETS: dict[str, Preset] = {
    "gpu": Preset(
        name="gpu",
        description=(
            "the implementation report's width and depth (hidden 384, 6 layers, 6 heads of 64) at "
            "sequence 512, 400 steps of 32 sequences, with the Triton kernels in bf16 autocast "
            "on one GPU"
        ),
        device="cuda",
        hidden_size=384,
        num_layers=6,
        num_heads=6,
        dropout=0.1,
        backend="triton",
        # The budget, an ESTIMATE (never measured whole on a GPU). What was measured, on one H200
        # (figures/gpu_check/): the Triton kernels' forward+backward at sequence 1024, batch 16,
        # 32 heads of 64, bf16 (nvidia_h200.json): 1.3 ms plain softmax, 3.4 rope, 7.2 rse, 6.8
        # kerple, 330 cope. Per token of this model (6 layers of 6 heads, sequence 512: half the
        # per-token cost at 1024) that is about 0.25 us for rse, the slowest but one, and 11 us
        # for cope. The dense layers, about 64 MFLOP per token to train, at an assumed 150
        # TFLOP/s (not measured), add about 0.4 us. So: about 1M tokens/s for every arm but
        # cope, about 85k for cope. The short training check (nvidia_h200_training.json:
        # 47k-307k tokens/s, 60 steps at sequence 256) is dominated by the first compilation
        # of the kernels (87 s for 13 arms), so it bounds nothing but that one-off cost. A run
        # trains 400 x 32 x 512 = 6.6M tokens: about 7 s (cope about 77 s), then evaluation
        # (about 2 s) and the probes (word order 3 x 200 steps, retrieval 2 x 400 on the clm runs;
        # at an assumed 6 ms a step, 4-8 s). Estimated: seed 0 of every arm under both objectives
        # (32 runs) about 10 minutes; the sweep (138 runs, training and the selection loss)
        # about 25 minutes; all five seeds (160 runs) and the sweep about 70 minutes, a fifth of
        # it cope's 11 runs. --budget-minutes makes it in slices, the sweep first.
        train=TrainConfig(
            steps=400,
            batch_size=32,
            seq_len=512,
            learning_rate=1e-3,
            warmup_steps=40,
            eval_every=100,
            eval_windows=64,
            eval_batch_size=32,
            log_every=10,
            checkpoint_every=100,
            autocast_dtype="bfloat16",
        ),
        probes=(
            ProbeSpec(
                "word_order", 2048, 512, _probe_config(200, 64, 3e-4), finetune_seeds=(0, 1, 2)
            ),  # fmt: skip
            ProbeSpec(
                "retrieval",
                4096,
                1024,
                _probe_config(400, 64, 3e-4),
                context_len=32,
                objectives=("clm",),
                finetune_seeds=(0, 1),
            ),  # fmt: skip
        ),
        eval_batch_size=16,
        eval_windows=512,  # test windows at the training length
        long_windows=64,  # windows of 8 x 512
        seeds=(0, 1, 2, 3, 4),
        ablations=_ALL_ABLATIONS,
        learning_rates=(5e-4, 1e-3, 2e-3),
        sweep_seeds=(1000, 1001),
        long_mask_draws=2,
    ),
    "cpu": Preset(
        name="cpu",
        description=(
            "a small model (hidden 64, 2 layers, 4 heads of 16, sequence 64; 300 steps for clm, "
            "1000 for mlm, batch 16; the learning rate of each encoding from a sweep of "
            "1.5e-3 to 2.4e-2 for clm and 7.5e-4 to 6e-3 for mlm over two seeds) with the "
            "reference attention on one CPU thread"
        ),
        device="cpu",
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        dropout=0.0,
        backend="reference",
        train=TrainConfig(
            steps=300,
            batch_size=16,
            seq_len=64,
            learning_rate=3e-3,
            warmup_steps=30,
            eval_every=50,
            eval_windows=128,
            checkpoint_every=50,
        ),
        probes=(
            # eval: every distinct unseen pair drawn from 1024 (about 330 pairs of 624)
            ProbeSpec(
                "word_order", 512, 2048, _probe_config(200, 32, 1e-3), finetune_seeds=(0, 1, 2)
            ),  # fmt: skip
            # The causal models only, as in the gpu preset (it keeps the CPU budget).
            ProbeSpec(
                "retrieval",
                2048,
                1024,
                _probe_config(400, 32, 1e-3),
                objectives=("clm",),
                finetune_seeds=(0, 1, 2),
            ),  # fmt: skip
        ),
        cpu_threads=1,
        mlm_steps=1000,
        # The size of the whole run, from the CPU seconds of the committed runs (one thread per
        # process; their wall time was 2-3x longer, the machine was shared): a masked run about
        # 46 s (stick-breaking and RSE about 92 s), a causal one about 40 s (50 s); the sweep's
        # 210 runs (two sweep seeds) about 4,500 s in all. Six seeds of every arm under both
        # objectives would take about 14,000 CPU s for the runs alone; so: five seeds (the fewest
        # the verdicts are read from), and each ablation only under the objective its question
        # is about (arms.py; rse.stick_bias under both): about 12,200 CPU s with the sweep, about
        # 100 min on 2 idle cores. A sixth seed can be added later (--seeds 5).
        seeds=(0, 1, 2, 3, 4),
        ablations=_ALL_ABLATIONS,
        # A first grid of 1.5e-3, 3e-3 and 6e-3 for both objectives put every encoding at an
        # edge: the masked runs at the smallest rate (rope: 1.84 at 1.5e-3, 2.17 at 3e-3, 2.60 at
        # 6e-3), the causal ones at the largest (rope: 2.18, 2.00, 1.92); each grid reaches one
        # step further on its side. With that grid and one sweep seed, causal CoPE and
        # stick-breaking chose its top rate, 1.2e-2, which retrained badly on scored seeds
        # (stick-breaking seed 0: 2.10 there against 1.76 at 6e-3): the rate is now the lowest
        # mean over two sweep seeds, and the causal grid reaches 2.4e-2.
        learning_rates=(1.5e-3, 3e-3, 6e-3, 1.2e-2, 2.4e-2),
        mlm_learning_rates=(7.5e-4, 1.5e-3, 3e-3, 6e-3),
        sweep_seeds=(1000, 1001),
    ),
    "tiny": Preset(
        name="tiny",
        description=(
            "a tiny budget (hidden 64, 2 layers, 4 heads of 16, sequence 40, 100 steps) for tests "
            "and live demonstrations"
        ),
        device="cpu",
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        dropout=0.0,
        backend="reference",
        train=TrainConfig(
            steps=100,
            batch_size=16,
            seq_len=40,
            learning_rate=3e-3,
            warmup_steps=10,
            eval_every=25,
            eval_windows=32,
            checkpoint_every=50,
        ),
        probes=(
            ProbeSpec("word_order", 256, 128, _probe_config(300, 32, 1e-3)),
            ProbeSpec("retrieval", 512, 128, _probe_config(100, 32, 1e-3), objectives=("clm",)),
        ),
        cpu_threads=1,
        eval_windows=128,
        mask_draws=2,
        long_windows=16,
        long_mask_draws=1,
    ),
}


def choose_preset(name: str = "auto") -> Preset:
    """``PRESETS[name]``; ``"auto"`` is ``gpu`` on a CUDA GPU that can run it (bf16 tensor cores
    for its bf16 autocast), else ``cpu``."""
    if name == "auto":
        name = "gpu" if gpu_has_bf16() else "cpu"
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid: 'auto', {', '.join(map(repr, PRESETS))}")
    preset = PRESETS[name]
    if preset.device == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"preset {name!r} needs a CUDA GPU and none is available; use preset='cpu' or 'tiny'"
        )
    if preset.device == "cuda" and preset.train.autocast_dtype == "bfloat16" and not gpu_has_bf16():
        raise ValueError(
            f"preset {name!r} trains in bf16 autocast, which needs bf16 tensor cores (compute "
            f"capability 8.0 or newer: A100, L4, RTX 30xx and later, H100); this GPU "
            f"({torch.cuda.get_device_name()}, compute capability "
            f"{'.'.join(map(str, torch.cuda.get_device_capability()))}) has none. Use "
            "preset='cpu' or 'tiny' (their runs would not be the gpu preset's anyway)"
        )
    return preset
