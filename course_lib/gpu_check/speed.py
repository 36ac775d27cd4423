"""Speed: each method's kernels against what a user would pick instead, at several lengths.

Shape: the benchmark's (``course_lib.bench``): ``tokens // seq`` sequences of ``hidden //
head_dim`` heads, so every length holds 16384 tokens of width 2048; causal; bf16 (fp16 on a GPU
without bf16). Per method and size, forward and forward + backward:

* ``kernel``: ``attention(..., backend="triton")`` with the method's parameters (tables built
  per call, as a user's call builds them);
* the alternative, decided from the record: plain attention is PyTorch's SDPA; a q/k transform
  alone is the record's PyTorch transform, then SDPA; a score bias that depends on the distance
  only (checked on the record's own bias by shifting every position) is FlexAttention with a
  ``score_mod`` reading that bias per distance, after the transform if any; stick-breaking, a
  bias from the scores or from content have no such form (said so, not timed).

Times are medians (:meth:`.device.Device.measure`); peak memory is what one call allocates on
top of its inputs. ``vs SDPA`` is SDPA's time over the method's (above 1: faster than plain
SDPA); ``vs alternative`` is the alternative's over the kernel's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from course_lib.gpu_check.cases import make_inputs, methods

__all__ = ["SpeedCase", "add_ratios", "alternative", "run_speed", "speed_cases", "speed_shape"]

TOKENS, HIDDEN = 16384, 2048
PASSES = ("fwd", "fwd+bwd")
SHIFT = 7  # positions are shifted by this much to test that a bias depends on distance only

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def speed_shape(seq: int, head_dim: int, tokens: int = TOKENS, hidden: int = HIDDEN):
    """``(batch, heads)`` of one size: ``tokens // seq`` sequences of ``hidden // head_dim``
    heads (at least one of each)."""
    return max(1, tokens // seq), max(1, hidden // head_dim)


@dataclass(frozen=True)
class SpeedCase:
    method: str
    head_dim: int
    seq: int
    dtype: str
    batch: int
    heads: int
    causal: bool = True


def speed_cases(seqs, head_dims, dtype: str, tokens: int = TOKENS,
                hidden: int = HIDDEN) -> list[SpeedCase]:  # fmt: skip
    """Every method at every (head_dim, seq), causal, at the shape of :func:`speed_shape`."""
    return [
        SpeedCase(name, d, n, dtype, *speed_shape(n, d, tokens, hidden))
        for d in head_dims
        for n in seqs
        for name in methods()
    ]


def _full_params(encoding, inputs, causal: bool) -> dict:
    """The record's defaults completed with the case's parameters, checked (and derived
    defaults filled) by the record's own ``check_params``, as ``attention()`` does."""
    params = {**encoding.params, "scale": None, **inputs.params}
    batch, heads, seq, head_dim = inputs.q.shape
    if inputs.positions is not None:
        positions = inputs.positions[None]
    else:  # hooks that read no position still get the token indices, as in attention()
        positions = torch.arange(seq, device=inputs.q.device)[None]
    if encoding.check_params is not None:
        encoding.check_params(
            params,
            heads=heads,
            head_dim=head_dim,
            device=inputs.q.device,
            causal=causal,
            positions=positions,
            batch=batch,
        )
    return params


def distance_table(encoding, params: dict, heads: int, seq: int, device) -> torch.Tensor | str:
    """``[heads, 2 seq - 1]``: the record's score bias between a query and a key ``j - i``
    apart (index ``j - i + seq - 1``), or why the bias is not a function of the distance."""
    if not encoding.uses_positions or encoding.position_dims != 1:
        return "its score bias is not a function of the distance between two tokens"
    query = torch.tensor([[seq - 1]], device=device)
    keys = torch.arange(2 * seq - 1, device=device)[None]
    with torch.no_grad():
        bias = encoding.score_bias(query, keys, params)
        shifted = encoding.score_bias(query + SHIFT, keys + SHIFT, params)
    bias = torch.as_tensor(bias).float().expand(1, heads, 1, 2 * seq - 1)[0, :, 0]
    shifted = torch.as_tensor(shifted).float().expand(1, heads, 1, 2 * seq - 1)[0, :, 0]
    if not torch.allclose(bias, shifted, atol=1e-6, rtol=1e-5):
        return "its score bias depends on more than the distance between two tokens"
    return bias.contiguous()


_FLEX: list = []


def _flex():
    """FlexAttention compiled once for the run (uncompiled it materialises the scores), or
    None where the installed PyTorch has none."""
    if not _FLEX:
        try:
            import torch._dynamo
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        except ImportError:
            _FLEX.append(None)
        else:
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
            _FLEX.append((torch.compile(flex_attention, dynamic=False), create_block_mask))
    return _FLEX[0]


def alternative(encoding, inputs, causal: bool) -> tuple[str, Attention | str]:
    """``(name, callable or the reason there is none)``: what a user would run instead."""
    import torch.nn.functional as F

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    if encoding is None:
        return "SDPA", sdpa
    if encoding.normaliser != "softmax":
        return "-", "no PyTorch attention computes stick-breaking weights"
    if encoding.score_bias_from_scores is not None:
        return "-", "its bias is computed from the scores: no score_mod form"
    params = _full_params(encoding, inputs, causal)
    positions = None if inputs.positions is None else inputs.positions[None]
    transform = encoding.qk_transform

    def prepare(x):
        return x if transform is None else transform(x, positions, params).to(x.dtype)

    prefix = "transform + " if transform is not None else ""
    if encoding.score_bias is None:
        return prefix + "SDPA", lambda q, k, v: sdpa(prepare(q), prepare(k), v)
    flex = _flex()
    if flex is None:
        return prefix + "FlexAttention", "this PyTorch has no FlexAttention"
    _, heads, seq, _ = inputs.q.shape
    table = distance_table(encoding, params, heads, seq, inputs.q.device)
    if isinstance(table, str):
        return prefix + "FlexAttention", table
    compiled, create_block_mask = flex
    offset = seq - 1

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + table[h, kv_idx - q_idx + offset]

    block_mask = None
    if causal:
        block_mask = create_block_mask(
            lambda b, h, q_idx, kv_idx: q_idx >= kv_idx,
            None,
            None,
            seq,
            seq,
            device=inputs.q.device,
        )

    return prefix + "FlexAttention", flex_with_smaller_tiles_on_demand(
        lambda q, k, v, options: compiled(
            prepare(q), prepare(k), v, score_mod=score_mod, block_mask=block_mask,
            kernel_options=options,
        )  # fmt: skip
    )


#: FlexAttention's own choice first, then smaller pipelines and tiles: a score_mod that reads a
#: captured table can ask for more shared memory than the GPU has (seen on an H200 with
#: PyTorch 2.11: 245,760 bytes asked, 232,448 there), and Inductor then finds no valid config.
FLEX_OPTIONS: tuple[dict | None, ...] = (
    None,
    {"num_stages": 1},
    {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 1},
)


def flex_with_smaller_tiles_on_demand(call) -> Attention:
    """``call(q, k, v, kernel_options)`` as an attention: on an out-of-resources compile error it
    moves to the next entry of :data:`FLEX_OPTIONS` and keeps the first that compiles."""
    chosen = [0]

    def run(q, k, v):
        while True:
            try:
                return call(q, k, v, FLEX_OPTIONS[chosen[0]])
            except Exception as exc:  # Inductor wraps the resource error in its own types
                text = str(exc)
                if "out of resource" not in text and "No valid triton configs" not in text:
                    raise
                if chosen[0] + 1 == len(FLEX_OPTIONS):
                    raise
                chosen[0] += 1

    return run


def _kernel(case: SpeedCase, inputs) -> Attention:
    from course_lib.attention import attention

    return lambda q, k, v: attention(
        q,
        k,
        v,
        method=case.method,
        causal=case.causal,
        position_ids=inputs.positions,
        backend="triton",
        **inputs.params,
    )


def time_one(device, fn: Attention, inputs, pass_: str) -> tuple[float, int]:
    """``(ms, peak bytes)`` of one pass of ``fn`` on ``inputs``."""
    if pass_ == "fwd":

        def step():
            with torch.no_grad():
                fn(inputs.q, inputs.k, inputs.v)

        return device.measure(step, [])
    leaves = [x.detach().requires_grad_() for x in (inputs.q, inputs.k, inputs.v)]
    leaves += [p for p in inputs.params.values() if torch.is_tensor(p) and p.requires_grad]

    def step():
        fn(*leaves[:3]).backward(inputs.grad_out)

    return device.measure(step, leaves)


def _record(case: SpeedCase, contender: str, pass_: str) -> dict:
    return dict(
        method=case.method, contender=contender, head_dim=case.head_dim, seq=case.seq,
        batch=case.batch, heads=case.heads, dtype=case.dtype, causal=case.causal, pass_=pass_,
        ms=None, peak_mib=None, status="ok",
    )  # fmt: skip


def measure_case(device, case: SpeedCase) -> list[dict]:
    """The kernel's and the alternative's records of one case (forward, forward + backward)."""
    encoding = methods()[case.method]
    records = []
    try:
        inputs = make_inputs(
            encoding,
            batch=case.batch,
            heads=case.heads,
            seq=case.seq,
            head_dim=case.head_dim,
            dtype=case.dtype,
            device=device.torch_device,
        )
    except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
        return [
            dict(_record(case, "kernel", "fwd"), status=f"error: {type(exc).__name__}: {exc}"[:300])
        ]
    if encoding is not None and encoding.kernel_support:
        kernel: Attention | str = f"no kernel: {encoding.kernel_support}"
    else:
        kernel = _kernel(case, inputs)
    contenders: list[tuple[str, Attention | str]] = [("kernel", kernel)]
    try:
        contenders.append(alternative(encoding, inputs, case.causal))
    except Exception as exc:  # noqa: BLE001
        contenders.append(("-", f"error: {type(exc).__name__}: {exc}"[:300]))
    for name, fn in contenders:
        for pass_ in PASSES:
            record = _record(case, name, pass_)
            if isinstance(fn, str):
                record["status"] = fn
            else:
                try:
                    ms, peak = time_one(device, fn, inputs, pass_)
                    record.update(ms=ms, peak_mib=peak / 2**20)
                except torch.cuda.OutOfMemoryError:
                    record["status"] = "OOM"
                except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                    record["status"] = f"error: {type(exc).__name__}: {exc}"[:300]
            records.append(record)
    del inputs
    device.free()
    return records


def run_speed(device, cases: list[SpeedCase]) -> list[dict]:
    """Every case, one after the other (timings alone on the GPU), with a progress bar; the
    ratios added (:func:`add_ratios`)."""
    from tqdm.auto import tqdm

    records = []
    for case in tqdm(cases, desc="speed"):
        records += measure_case(device, case)
    add_ratios(records)
    return records


def add_ratios(records: list[dict]) -> None:
    """``vs_sdpa`` on every timed record (SDPA's time at the same size and pass over the
    record's) and ``vs_alternative`` on every timed kernel record (its alternative's time over
    the kernel's); None where either is missing."""

    def key(r):
        return (r["head_dim"], r["seq"], r["causal"], r["dtype"], r["pass_"])

    sdpa = {key(r): r["ms"] for r in records if r["contender"] == "SDPA" and r["ms"]}
    alternatives = {
        (r["method"], *key(r)): r["ms"]
        for r in records
        if r["contender"] not in ("kernel", "SDPA", "-") and r["ms"]
    }
    for r in records:
        if not r["ms"]:
            r["vs_sdpa"] = r["vs_alternative"] = None
            continue
        base = sdpa.get(key(r))
        r["vs_sdpa"] = base / r["ms"] if base else None
        other = alternatives.get((r["method"], *key(r)))
        if r["method"] == "softmax" and r["contender"] == "kernel":
            other = base
        r["vs_alternative"] = other / r["ms"] if other and r["contender"] == "kernel" else None
