"""A tiny vision transformer and an image task where 2-D position matters (chapter 09).

**The task, "where is the square?"** A two-channel image (channel 0: a filled square, channel 1:
a filled disc, like a red square and a blue circle) of ``grid * PATCH`` pixels a side. The label
says where the square is relative to the circle: ``left``, ``right``, ``above`` or ``below``,
along the axis of the larger offset between their centres (scenes where the two offsets differ
by less than one patch are not drawn, so every label is clear). Each patch alone shows at most a
piece of one shape; the answer needs where the pieces are, in both directions.

**Resolution extrapolation.** Train on an 8 x 8 patch grid, test on 12 x 12 and 16 x 16 (Heo et
al. 2024's headline for RoPE in vision transformers). Two kinds of test scene:

* ``"moved"``: a scene drawn exactly as in training (on an 8 x 8 grid), pasted at a random
  whole-patch offset into the larger image: the same patches and the same offsets between them,
  at positions never seen in training;
* ``"anywhere"``: the two shapes placed anywhere in the larger image, so their offsets can also
  be larger than any seen in training (up to 15 patches instead of 7).

**The model** (:class:`TinyViT`): 4 x 4 patches, a linear patch embedding, pre-norm transformer
layers whose attention is any registered encoding's module, then attention pooling (a learned
score per patch, softmax over the patches, a weighted mean; it needs no position and does not
dilute the shapes' patches when the image grows) and a linear classifier. Positions: the
(row, column) of every patch for 2-D encodings, the flattened index ``row * width + col`` for
1-D ones (so ``"rope"`` here is RoPE on the flattened patch index), none for ``"none"``.

``python -m course_lib.vision --out figures/09_vit/results.json`` trains every variant with five
seeds and writes the results the notebook reads (seeded, so a rerun on one machine gives the
same numbers; ``--variants``/``--seeds`` pick some and ``--merge`` joins the results of such
partial runs).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.attention import get_attention_class
from course_lib.registry import get_encoding

__all__ = [
    "PATCH",
    "CHANNELS",
    "CLASSES",
    "PLACEMENTS",
    "VARIANTS",
    "grid_coords",
    "flat_positions",
    "draw_scenes",
    "TinyViT",
    "TrainConfig",
    "train_vit",
    "accuracy",
    "fit_to_grid",
    "run_experiment",
    "merge_results",
]

PATCH = 4  # pixels per patch side
CHANNELS = 2  # channel 0: the square, channel 1: the circle
CLASSES = ("left", "right", "above", "below")  # where the square is, relative to the circle
PLACEMENTS = ("anywhere", "moved")
SQUARE_HALF = 2.5  # the square is 5 x 5 pixels
CIRCLE_RADIUS = 3.2
MARGIN = float(PATCH)  # | |dx| - |dy| | >= one patch: no ambiguous scene
MIN_DISTANCE = 8.0  # centres at least 8 pixels apart: the shapes never overlap

# The variants the chapter compares: display name -> registered encoding. "rope" (1-D) reads the
# flattened patch index; the 2-D encodings read (row, column). "comrope (course form)" is the
# course's shared-eigenbasis parametrisation of commuting generators; ComRoPE-AP and -LD are the
# paper's two solutions.
VARIANTS: dict[str, str] = {
    "none": "none",
    "learned_2d": "learned_2d",
    "rope (flattened)": "rope",
    "rope_2d": "rope_2d",
    "rope_mixed": "rope_mixed",
    "liere": "liere",
    "comrope_ap": "comrope_ap",
    "comrope_ld": "comrope_ld",
    "comrope (course form)": "comrope",
}


def grid_coords(rows: int, cols: int, device=None) -> torch.Tensor:
    """The (row, column) of every patch in row-major order: int64 ``[rows * cols, 2]``."""
    r = torch.arange(rows, device=device).repeat_interleave(cols)
    c = torch.arange(cols, device=device).repeat(rows)
    return torch.stack((r, c), dim=-1)


def flat_positions(rows: int, cols: int, device=None) -> torch.Tensor:
    """The flattened patch index ``row * cols + col``: int64 ``[rows * cols]``."""
    return torch.arange(rows * cols, device=device)


def _sample_centres(n: int, size: float, generator: torch.Generator) -> torch.Tensor:
    """``[n, 4]`` centres (square y, x, circle y, x) in pixels on a ``size``-pixel canvas, drawn
    uniformly among the scenes with a clear label (rejection sampling, vectorised)."""
    lo, hi = CIRCLE_RADIUS + 0.5, size - CIRCLE_RADIUS - 0.5
    kept: list[torch.Tensor] = []
    total = 0
    while total < n:
        c = lo + (hi - lo) * torch.rand(4 * n, 4, generator=generator, dtype=torch.float64)
        dy, dx = c[:, 0] - c[:, 2], c[:, 1] - c[:, 3]
        ok = ((dx.abs() - dy.abs()).abs() >= MARGIN) & (dx.hypot(dy) >= MIN_DISTANCE)
        kept.append(c[ok])
        total += int(ok.sum())
    return torch.cat(kept)[:n]


def _labels(centres: torch.Tensor) -> torch.Tensor:
    dy, dx = centres[:, 0] - centres[:, 2], centres[:, 1] - centres[:, 3]
    horizontal = dx.abs() > dy.abs()
    label = torch.where(dx < 0, 0, 1)  # left, right
    return torch.where(horizontal, label, torch.where(dy < 0, 2, 3))  # above, below


def _render(centres: torch.Tensor, size: int) -> torch.Tensor:
    """Binary images ``[n, 2, size, size]`` (float32) of the square and the disc."""
    pixel = torch.arange(size, dtype=torch.float64) + 0.5
    yy, xx = pixel[None, :, None], pixel[None, None, :]
    sy, sx, cy, cx = (centres[:, i, None, None] for i in range(4))
    square = ((yy - sy).abs() <= SQUARE_HALF) & ((xx - sx).abs() <= SQUARE_HALF)
    disc = (yy - cy) ** 2 + (xx - cx) ** 2 <= CIRCLE_RADIUS**2
    return torch.stack((square, disc), dim=1).to(torch.float32)


def draw_scenes(
    n: int,
    grid: int,
    *,
    generator: torch.Generator,
    placement: str = "anywhere",
    scene_grid: int = 8,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` scenes on a ``grid x grid`` patch grid: images ``[n, 2, grid*PATCH, grid*PATCH]``
    (float32, 0/1) and labels ``[n]`` (int64, indices into :data:`CLASSES`).

    ``placement="anywhere"``: the shapes anywhere in the image. ``"moved"``: a scene drawn on a
    ``scene_grid`` grid, pasted at a random whole-patch offset (same patches, same offsets).
    """
    if placement not in PLACEMENTS:
        raise ValueError(
            f"unknown placement {placement!r}; valid: {', '.join(map(repr, PLACEMENTS))}"
        )
    if not isinstance(grid, int) or grid < 3:
        raise ValueError(f"grid must be an integer >= 3 (patches a side), got {grid!r}")
    size = grid * PATCH
    if placement == "anywhere":
        centres = _sample_centres(n, float(size), generator)
    else:
        if not isinstance(scene_grid, int) or not 3 <= scene_grid <= grid:
            raise ValueError(f"scene_grid must be an integer in 3..grid={grid}, got {scene_grid!r}")
        centres = _sample_centres(n, float(scene_grid * PATCH), generator)
        offset = torch.randint(0, grid - scene_grid + 1, (n, 2), generator=generator) * PATCH
        centres = centres + offset.to(torch.float64).repeat(1, 2)
    return _render(centres, size), _labels(centres)


class TinyViT(nn.Module):
    """Images ``[batch, 2, H, W]`` (H, W multiples of :data:`PATCH`) -> logits ``[batch, 4]``.

    ``encoding``: any registered encoding. ``max_side``: the largest grid side a table-based
    encoding covers (``learned_2d``: rows and columns ``0..max_side-1``; a 1-D table: indices
    ``0..max_side**2-1``). Extra keyword arguments go to the attention modules.
    """

    def __init__(
        self,
        encoding: str,
        *,
        hidden_size: int = 64,
        num_heads: int = 4,
        num_layers: int = 2,
        max_side: int = 8,
        backend: str = "reference",
        **encoding_options,
    ) -> None:
        super().__init__()
        spec = get_encoding(encoding)
        self.encoding = encoding
        if spec.position_dims == 2:
            self.position_kind = "grid"
        elif spec.inputs is not None or spec.uses_positions:
            self.position_kind = "flat"
        else:
            self.position_kind = "none"
        table = max_side if self.position_kind == "grid" else max_side**2
        attention_class = get_attention_class(encoding)
        self.patch_embedding = nn.Linear(CHANNELS * PATCH * PATCH, hidden_size)
        self.layers = nn.ModuleList()
        for _ in range(num_layers):
            self.layers.append(
                nn.ModuleDict(
                    {
                        "attention_norm": nn.LayerNorm(hidden_size),
                        "attention": attention_class(
                            hidden_size,
                            num_heads,
                            max_position_embeddings=table,
                            backend=backend,
                            **encoding_options,
                        ),  # fmt: skip
                        "feed_forward_norm": nn.LayerNorm(hidden_size),
                        "feed_forward": nn.Sequential(
                            nn.Linear(hidden_size, 2 * hidden_size),
                            nn.GELU(),
                            nn.Linear(2 * hidden_size, hidden_size),
                        ),
                    }
                )
            )
        self.final_norm = nn.LayerNorm(hidden_size)
        self.pool_score = nn.Linear(hidden_size, 1)
        self.classifier = nn.Linear(hidden_size, len(CLASSES))

    def positions(self, rows: int, cols: int, device=None) -> torch.Tensor | None:
        """What the attention modules get: ``[rows*cols, 2]``, ``[rows*cols]`` or None."""
        if self.position_kind == "grid":
            return grid_coords(rows, cols, device)
        if self.position_kind == "flat":
            return flat_positions(rows, cols, device)
        return None

    def patches(self, images: torch.Tensor) -> torch.Tensor:
        """``[batch, 2, H, W] -> [batch, (H/P) * (W/P), 2*P*P]``, patches in row-major order."""
        if images.dim() != 4 or images.shape[1] != CHANNELS:
            raise ValueError(f"images must be [batch, {CHANNELS}, H, W], got {tuple(images.shape)}")
        b, c, h, w = images.shape
        if h % PATCH or w % PATCH:
            raise ValueError(f"image height and width must be multiples of {PATCH}, got {h} x {w}")
        x = images.reshape(b, c, h // PATCH, PATCH, w // PATCH, PATCH)
        return x.permute(0, 2, 4, 1, 3, 5).reshape(b, (h // PATCH) * (w // PATCH), -1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        rows, cols = images.shape[2] // PATCH, images.shape[3] // PATCH
        h = self.patch_embedding(self.patches(images))  # [batch, seq, hidden]
        position_ids = self.positions(rows, cols, images.device)
        for layer in self.layers:
            h = h + layer["attention"](layer["attention_norm"](h), position_ids=position_ids)
            h = h + layer["feed_forward"](layer["feed_forward_norm"](h))
        h = self.final_norm(h)
        weights = torch.softmax(self.pool_score(h).squeeze(-1), dim=-1)  # [batch, seq]
        pooled = (weights.unsqueeze(-1) * h).sum(1)  # [batch, hidden]
        return self.classifier(pooled)


def fit_to_grid(model: TinyViT, side: int) -> bool:
    """Stretch every position table of ``model`` to cover a ``side x side`` grid (the opt-in
    interpolation vision transformers use at a new resolution). Returns True if a table was
    stretched, False if the model has none (or it already covers the grid)."""
    stretched = False
    for layer in model.layers:
        attention = layer["attention"]
        resize = getattr(attention, "resize_position_table", None)
        if resize is None:
            continue
        need = side if model.position_kind == "grid" else side * side
        if attention.max_position_embeddings < need:
            resize(need)
            stretched = True
    return stretched


@dataclass(frozen=True)
class TrainConfig:
    """One training run: sizes, budget and seed."""

    grid: int = 8
    hidden_size: int = 64
    num_heads: int = 4
    num_layers: int = 2
    steps: int = 400
    batch_size: int = 64
    learning_rate: float = 2e-3
    weight_decay: float = 0.01
    warmup: int = 50
    log_every: int = 25
    seed: int = 0


def _learning_rate(step: int, config: TrainConfig) -> float:
    """Linear warmup, then cosine decay to 0."""
    if step < config.warmup:
        return config.learning_rate * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.steps - config.warmup)
    return config.learning_rate * 0.5 * (1 + math.cos(math.pi * progress))


def train_vit(
    encoding: str, config: TrainConfig = TrainConfig(), *, progress: bool = False
) -> tuple[TinyViT, dict]:
    """Train a :class:`TinyViT` on fresh scenes of the ``config.grid`` grid; return it and its
    history ``{"step": [...], "loss": [...], "seconds": float}`` (loss: mean over each
    ``log_every`` steps)."""
    torch.manual_seed(config.seed)
    model = TinyViT(
        encoding, hidden_size=config.hidden_size, num_heads=config.num_heads,
        num_layers=config.num_layers, max_side=config.grid,
    )  # fmt: skip
    optimiser = torch.optim.AdamW(
        model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay
    )
    data = torch.Generator().manual_seed(10_000 + config.seed)
    history: dict = {"step": [], "loss": []}
    steps = range(config.steps)
    if progress:
        from tqdm.auto import tqdm

        steps = tqdm(steps, desc=encoding, leave=False)
    running, start = 0.0, time.perf_counter()
    model.train()
    for step in steps:
        images, labels = draw_scenes(config.batch_size, config.grid, generator=data)
        for group in optimiser.param_groups:
            group["lr"] = _learning_rate(step, config)
        loss = F.cross_entropy(model(images), labels)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        running += float(loss.detach())
        if (step + 1) % config.log_every == 0:
            history["step"].append(step + 1)
            history["loss"].append(running / config.log_every)
            running = 0.0
    history["seconds"] = time.perf_counter() - start
    model.eval()
    return model, history


@torch.no_grad()
def accuracy(
    model: TinyViT,
    grid: int,
    *,
    placement: str = "anywhere",
    n: int = 1000,
    seed: int = 123,
    batch_size: int = 200,
) -> float:
    """Accuracy of ``model`` on ``n`` seeded scenes of a ``grid x grid`` patch grid."""
    images, labels = draw_scenes(n, grid, generator=torch.Generator().manual_seed(seed),
                                 placement=placement)  # fmt: skip
    correct = 0
    for start in range(0, n, batch_size):
        logits = model(images[start : start + batch_size])
        correct += int((logits.argmax(-1) == labels[start : start + batch_size]).sum())
    return correct / n


def run_experiment(
    variants: dict[str, str] | None = None,
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4),
    config: TrainConfig = TrainConfig(),
    test_grids: tuple[int, ...] = (12, 16),
    test_size: int = 500,
) -> dict:
    """Train every variant with every seed; test on the training grid and on ``test_grids``
    (both placements). Returns a JSON-ready dict (per variant and seed: accuracies, loss curve,
    seconds, parameter counts)."""
    from tqdm.auto import tqdm

    variants = dict(VARIANTS if variants is None else variants)
    results: dict = {
        "config": asdict(config),
        "seeds": list(seeds),
        "test_grids": list(test_grids),
        "test_size": test_size,
        "variants": {},
    }
    runs = [(label, encoding, seed) for label, encoding in variants.items() for seed in seeds]
    for label, encoding, seed in tqdm(runs, desc="runs"):
        model, history = train_vit(encoding, TrainConfig(**{**asdict(config), "seed": seed}),
                                   progress=True)  # fmt: skip
        position_params = sum(
            p.numel()
            for layer in model.layers
            for name, p in layer["attention"].named_parameters()
            if name.split(".")[0] not in ("query", "key", "value", "out")
        )
        run = {
            "seed": seed,
            "seconds": round(history["seconds"], 1),
            "loss_steps": history["step"],
            "loss": [round(v, 4) for v in history["loss"]],
            "parameters": sum(p.numel() for p in model.parameters()),
            "position_parameters": position_params,
            "accuracy": {f"{config.grid}x{config.grid}": accuracy(model, config.grid, n=test_size)},
            "interpolated_table": False,
        }
        for grid in test_grids:
            tested = copy.deepcopy(model)  # each grid stretches the trained table afresh
            run["interpolated_table"] = fit_to_grid(tested, grid) or run["interpolated_table"]
            for placement in PLACEMENTS:
                run["accuracy"][f"{grid}x{grid} {placement}"] = accuracy(
                    tested, grid, placement=placement, n=test_size, seed=1000 + grid
                )
        entry = results["variants"].setdefault(label, {"encoding": encoding, "runs": []})
        entry["runs"].append(run)
    return results


def merge_results(parts: list[dict]) -> dict:
    """One results dict from several of :func:`run_experiment` with the same configuration
    (each run is seeded on its own, so splitting the runs over processes, by seed or by variant,
    gives the numbers of one process). Every (variant, seed) must come from one part only.
    Variants keep the order of :data:`VARIANTS`, runs the order of their seeds."""
    if not parts:
        raise ValueError("nothing to merge: give at least one results dict")
    first = parts[0]
    for part in parts[1:]:
        for key in ("config", "test_grids", "test_size"):
            if part[key] != first[key]:
                raise ValueError(f"cannot merge results with different {key}: {part[key]!r}")
    variants: dict = {}
    for label in [*VARIANTS, *(v for part in parts for v in part["variants"])]:
        if label in variants:
            continue
        entries = [part["variants"][label] for part in parts if label in part["variants"]]
        if not entries:
            continue
        runs = sorted((run for e in entries for run in e["runs"]), key=lambda r: r["seed"])
        seeds = [run["seed"] for run in runs]
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"variant {label!r} has seeds {seeds} in several parts; each once")
        variants[label] = {"encoding": entries[0]["encoding"], "runs": runs}
    seeds = sorted({run["seed"] for entry in variants.values() for run in entry["runs"]})
    return {**first, "seeds": seeds, "variants": variants}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="figures/09_vit/results.json")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=TrainConfig.steps)
    parser.add_argument("--test-size", type=int, default=500)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument(
        "--merge", nargs="+", type=Path, metavar="RESULTS",
        help="merge results files of runs with disjoint seeds into --out instead of training",
    )  # fmt: skip
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.merge:
        merged = merge_results([json.loads(p.read_text()) for p in args.merge])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(merged, indent=1) + "\n")
        print(f"wrote {out} (seeds {merged['seeds']})")
        return
    torch.set_num_threads(1)
    config = TrainConfig(steps=args.steps)
    variants = {v: VARIANTS[v] for v in args.variants}
    results = run_experiment(variants, tuple(args.seeds), config, test_size=args.test_size)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
