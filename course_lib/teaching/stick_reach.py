"""Why some models score exactly 1/2 on the word-order probe: the answer cannot reach the nouns.

In ``the cat likes the dog. who likes? [MASK]`` the answer's position must reach the subject
noun, about 30 bytes back, behind many nearer bytes. A bidirectional stick is broken from the
nearest key outward (notebook 05): if the nearer keys break off their shares, almost nothing is
left for the far ones, so the answer's position puts a vanishing weight on the nouns, and a
fine-tune gets no gradient through them. :func:`layer_attention_weights` reads each layer's
weights off a trained :class:`~course_lib.model.MiniBert`; :func:`noun_reach` measures, on probe
examples, the weight the answer puts on each noun and the gradient of the probe's loss that
reaches the nouns' embeddings. :func:`retrieval_reach` measures the same kind of thing for the
retrieval probe, after its fine-tune: how much attention the position that predicts the answer
puts on the queried symbol, against the other symbols of the context.
:func:`export_model` / :func:`load_model` keep the weights of a comparison run (without its
optimiser) small enough to commit.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from course_lib.attention import attention_weights
from course_lib.data import ProbeBatch
from course_lib.evaluate import probe_inputs
from course_lib.model import BertConfig, MiniBert

__all__ = [
    "export_model",
    "identity_fingerprint",
    "matches_run",
    "layer_attention_weights",
    "load_model",
    "noun_reach",
    "retrieval_reach",
]


def identity_fingerprint(identity: dict) -> str:
    """A short fingerprint of a run's ``identity`` (its results file's): the same configuration
    gives the same fingerprint on every machine."""
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def export_model(
    checkpoint: str | Path, model_config: dict, path: str | Path, identity: dict | None = None
) -> Path:
    """Write the model weights of a training ``checkpoint`` (from
    :func:`course_lib.train.save_checkpoint`) with its ``model_config`` (a results file's
    ``identity["model_config"]``) to ``path``; the optimiser state is left out. With the run's
    ``identity`` its fingerprint is saved too, so a reader can tell which results the weights
    belong to (:func:`matches_run`)."""
    saved = torch.load(checkpoint, map_location="cpu", weights_only=False)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"model_config": model_config, "model": saved["model"]}
    if identity is not None:
        record["identity_fingerprint"] = identity_fingerprint(identity)
    torch.save(record, path)
    return path


def matches_run(path: str | Path, result: dict) -> bool:
    """Whether the model saved at ``path`` was exported from the run whose results dict is
    ``result`` (False when the file is missing or was exported without a fingerprint)."""
    path = Path(path)
    if not path.exists():
        return False
    saved = torch.load(path, map_location="cpu", weights_only=False)
    return saved.get("identity_fingerprint") == identity_fingerprint(result["identity"])


def load_model(path: str | Path) -> MiniBert:
    """The :class:`MiniBert` saved by :func:`export_model`, in eval mode."""
    saved = torch.load(path, map_location="cpu", weights_only=False)
    model = MiniBert(BertConfig(**saved["model_config"]))
    model.load_state_dict(saved["model"])
    return model.eval()


def layer_attention_weights(model: MiniBert, input_ids: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's attention weights ``[batch, heads, seq, seq]`` on ``input_ids`` ``[batch,
    seq]`` (the reference computation of the layer's own encoding, options included; for
    stick-breaking the leftover on the query's own value is not in the matrix)."""
    captured: list[torch.Tensor] = []

    def capture(module, args):
        hidden = args[0]
        attention = module
        batch, seq, _ = hidden.shape
        positions = torch.arange(seq)
        h_qk, _ = attention.add_positions(hidden, positions[None].expand(batch, seq))
        q = attention._split_heads(attention.query(h_qk))
        k = attention._split_heads(attention.key(h_qk))
        captured.append(
            attention_weights(
                q,
                k,
                method=attention.spec.method,
                causal=model.causal,
                position_ids=positions if attention.spec.uses_positions else None,
                normaliser=attention.normaliser,
                **attention.attention_params(hidden),
            )  # fmt: skip
        )

    handles = [layer.attention.register_forward_pre_hook(capture) for layer in model.layers]
    try:
        with torch.no_grad():
            model(input_ids)
    finally:
        for handle in handles:
            handle.remove()
    return captured


def _noun_positions(probe: ProbeBatch) -> tuple[int, int]:
    """(subject, object) first-byte positions of the word-order examples (the same in all)."""
    text = probe.texts[0]
    subject = int(probe.target_position[0])
    noun = text[subject : subject + probe.answer_len]
    first_sentence = text.split(".")[0]
    obj = first_sentence.rindex(" ") + 1
    assert text[obj : obj + probe.answer_len] != noun
    return subject, obj


def noun_reach(model: MiniBert, probe: ProbeBatch) -> dict:
    """How much of the answer position's attention and of the probe loss's gradient reaches
    the nouns, on ``probe`` (word-order examples), as the probe scores the model: at the
    masked first answer byte (``mlm``) or at the byte before the answer (``clm``).

    ``weight``: ``{"subject"|"object": [layers, heads]}``, the mean attention weight from that
    position to the noun's bytes, summed over them. ``gradient``:
    ``{"subject"|"object"|"answer_neighbours": float}``, the mean norm of the gradient of the
    candidate cross-entropy (the probe's fine-tuning loss) with respect to the input embeddings
    at the noun's bytes, or at the 3 bytes before the answer, for comparison.
    """
    inputs, _, score_index = probe_inputs(probe, model.config.objective)
    subject, obj = _noun_positions(probe)
    span = probe.answer_len
    answer = int(score_index[0])
    weights = layer_attention_weights(model, inputs)
    reach = {
        name: torch.stack([w[:, :, answer, at : at + span].sum(-1).mean(0) for w in weights])
        for name, at in (("subject", subject), ("object", obj))
    }
    embeddings: list[torch.Tensor] = []

    def keep(module, args, output):
        output.retain_grad()
        embeddings.append(output)

    handle = model.token_embeddings.register_forward_hook(keep)
    try:
        model.zero_grad()
        logits = model(inputs).logits[torch.arange(len(inputs)), score_index]
        candidates = logits.gather(1, probe.candidate_ids)
        target = (probe.candidate_ids == probe.answer_id[:, None]).float().argmax(dim=1)
        F.cross_entropy(candidates, target).backward()
    finally:
        handle.remove()
        model.zero_grad()
    grad = embeddings[0].grad.norm(dim=-1)  # [N, seq]
    gradient = {
        "subject": float(grad[:, subject : subject + span].mean()),
        "object": float(grad[:, obj : obj + span].mean()),
        "answer_neighbours": float(grad[:, answer - 3 : answer].mean()),
    }
    return {"weight": {k: v.tolist() for k, v in reach.items()}, "gradient": gradient}


def retrieval_reach(model: MiniBert, probe: ProbeBatch) -> dict:
    """On retrieval examples (``<context>@<p>?<answer>``), read causally: the attention weight
    that the position predicting the answer (the ``?``) puts on the queried symbol
    ``context[p]``, and the mean weight it puts on each other symbol of the context.

    Returns ``{"target": [layers, heads], "other": [layers, heads]}`` (means over examples)."""
    if model.config.objective != "clm":
        raise ValueError("retrieval_reach reads a causal model (the probe is scored causally)")
    inputs, _, score_index = probe_inputs(probe, "clm")
    context = probe.texts[0].index("@")
    weights = layer_attention_weights(model, inputs)
    rows = torch.arange(len(probe))
    targets, others = [], []
    for w in weights:  # [N, H, S, S]
        at = w[rows, :, score_index, :context]  # [N, H, context]
        hit = at[rows, :, probe.target_position]  # [N, H]
        rest = (at.sum(-1) - hit) / (context - 1)
        targets.append(hit.mean(0))
        others.append(rest.mean(0))
    return {"target": torch.stack(targets).tolist(), "other": torch.stack(others).tolist()}


#: The comparison runs whose weights notebook 10 reads (``figures/compare_cpu/models/``).
NOTEBOOK_RUNS = ("mlm_rse_s0", "mlm_rope_s0", "mlm_rse.stick_bias_s0", "mlm_t5_s0", "clm_fox_s0")

#: The causal runs whose retrieval fine-tune :func:`main` measures with
#: :func:`retrieval_reach` (the result goes to ``models/retrieval_reach.json``).
RETRIEVAL_RUNS = ("clm_rope_s0", "clm_exposb_s0", "clm_alibi_s0", "clm_t5_s0", "clm_fox_s0")


def main() -> None:
    """``python -m course_lib.teaching.stick_reach``: after ``python -m course_lib.compare
    --preset cpu``, copy the weights of :data:`NOTEBOOK_RUNS` from their checkpoints into
    ``figures/compare_cpu/models/`` and print what :func:`noun_reach` finds in them; then
    fine-tune each of :data:`RETRIEVAL_RUNS` on the retrieval probe as the comparison does
    (its first fine-tune seed) and write what :func:`retrieval_reach` finds to
    ``models/retrieval_reach.json``."""
    from dataclasses import replace

    from course_lib.compare import PRESETS, default_out_dir
    from course_lib.train import probe_finetune

    folder = default_out_dir("cpu")
    preset = PRESETS["cpu"]
    probe = preset.probes[0].make("eval")
    torch.set_num_threads(preset.cpu_threads or torch.get_num_threads())

    def model_of(run: str) -> MiniBert:
        result = json.loads((folder / f"{run}.json").read_text(encoding="utf-8"))
        saved = torch.load(folder / "checkpoints" / f"{run}.pt", map_location="cpu",
                           weights_only=True)  # fmt: skip
        model = MiniBert(BertConfig(**result["identity"]["model_config"]))
        model.load_state_dict(saved["model"])
        return model.eval()

    for run in NOTEBOOK_RUNS:
        result = json.loads((folder / f"{run}.json").read_text(encoding="utf-8"))
        path = export_model(
            folder / "checkpoints" / f"{run}.pt",
            result["identity"]["model_config"],
            folder / "models" / f"{run}.pt",
            identity=result["identity"],
        )
        reach = noun_reach(load_model(path), probe)
        print(f"{path}: gradient {reach['gradient']}")
    spec = next(p for p in preset.probes if p.task == "retrieval")
    train_probe, eval_probe = spec.make("train"), spec.make("eval")
    found = {}
    for run in RETRIEVAL_RUNS:
        config = replace(spec.finetune, seed=spec.finetune_seeds[0])
        outcome = probe_finetune(model_of(run), train_probe, eval_probe, config, keep_model=True)
        found[run] = {
            "identity_fingerprint": identity_fingerprint(
                json.loads((folder / f"{run}.json").read_text(encoding="utf-8"))["identity"]
            ),
            "accuracy": outcome["accuracy"],
            "finetune": {"seed": config.seed, "steps": config.steps},
            **retrieval_reach(outcome["model"], eval_probe),
        }
        best = max(max(layer) for layer in found[run]["target"])
        print(f"{run}: accuracy {outcome['accuracy']:.3f}, largest weight on the target {best:.3f}")
    path = folder / "models" / "retrieval_reach.json"
    path.write_text(json.dumps(found, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
