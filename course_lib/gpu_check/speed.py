"""Speed: each method's kernels against what a user would pick instead, at several lengths.

Shape: the benchmark's (``course_lib.bench``): ``tokens // seq`` sequences of ``hidden //
head_dim`` heads, so every length holds 16384 tokens of width 2048; causal; bf16 (fp16 on a GPU
without bf16). Per method and size, forward and forward + backward:

* ``kernel``: ``attention(..., backend="triton")`` with the method's parameters (tables built
  per call, as a user's call builds them) and positions as a layer builds them (their facts
  known, so no call waits to read them: :func:`.cases.positions_for`);
* the alternative, decided from the record: plain attention is PyTorch's SDPA; a q/k transform
  alone is the record's PyTorch transform, then SDPA; a score bias that depends on the distance
  only (checked on the record's own bias by shifting every position) is FlexAttention with a
  ``score_mod`` (one slope per head times the distance where the bias has ALiBi's form, else
  the bias read from a table per distance), after the transform if any; stick-breaking, a
  bias from the scores or from content have no such form (said so, not timed).

FlexAttention is what a user runs (:class:`FlexBaseline`): compiled once for the run, with a
causal ``BlockMask`` built once per length. Plain attention also times FlexAttention with no
``score_mod`` against SDPA at each size (:data:`FLEX_SANITY`): where it is below
:data:`SANITY_MIN` x SDPA's speed, or missing, every comparison with FlexAttention is marked
unreliable (:func:`flex_sanity`). SDPA's records say which backend SDPA ran
(:func:`sdpa_backend`); FlexAttention's say which kernel options and ``score_mod`` form.

Times are medians (:meth:`.device.Device.measure`); peak memory is what one call allocates on
top of its inputs. ``vs SDPA`` is SDPA's time over the method's (above 1: faster than plain
SDPA); ``vs alternative`` is the alternative's over the kernel's. The kernel's records also
hold ``host_ms``, the host's time inside one call (its kernels not waited for), and
``host_reads``, the values one call reads back to the host (each waits for the GPU): where
``host_ms`` comes near ``ms``, the call is bound by the host, not by its kernels
(:meth:`.device.Device.host`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from course_lib.gpu_check.cases import make_inputs, methods
from course_lib.gpu_check.device import HOST_REPEATS

__all__ = [
    "FLEX_SANITY",
    "SANITY_MIN",
    "FlexBaseline",
    "SpeedCase",
    "add_ratios",
    "alternative",
    "flex_baseline",
    "flex_sanity",
    "host_one",
    "run_speed",
    "sdpa_backend",
    "speed_cases",
    "speed_shape",
]

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
    options: tuple = ()  # (name, value) pairs: one of the record's speed_variants

    @property
    def label(self) -> str:
        """The method, and the module arguments of a variant: ``cope npos=64``."""
        return " ".join([self.method, *(f"{k}={v}" for k, v in self.options)])


def speed_cases(seqs, head_dims, dtype: str, tokens: int = TOKENS,
                hidden: int = HIDDEN) -> list[SpeedCase]:  # fmt: skip
    """Every method at every (head_dim, seq), causal, at the shape of :func:`speed_shape`; a
    method whose record lists ``speed_variants`` also with each of them. The longest length
    comes first: the summary's headline and the speed goals are at it, and a run cut short
    (its report is written after each case) keeps them."""
    variants = {
        name: [(), *(tuple(v.items()) for v in (enc.speed_variants if enc else ()))]
        for name, enc in methods().items()
    }
    return [
        SpeedCase(name, d, n, dtype, *speed_shape(n, d, tokens, hidden), options=options)
        for n in sorted(seqs, reverse=True)
        for d in head_dims
        for name in methods()
        for options in variants[name]
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
    if not encoding.distance_only or encoding.position_dims != 1:  # the record's claim
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


def causal_mask(b, h, q_idx, kv_idx):
    """FlexAttention ``mask_mod`` of causal attention: a query sees itself and what precedes it."""
    return q_idx >= kv_idx


def _raise_recompile_limit(at_least: int) -> None:
    """Every size and both grad modes are specialisations of the one compiled FlexAttention; with
    ``fullgraph=True`` going past Dynamo's limit raises (it never falls back to eager)."""
    import torch._dynamo

    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), at_least))


class FlexBaseline:
    """FlexAttention as a user runs it: ``torch.compile``d once for the whole run (``fullgraph``:
    a graph break raises instead of running the unfused version, which materialises the scores),
    with a causal ``BlockMask`` built once per length and reused by every method at that length
    (the blocks above the diagonal are skipped, not computed and masked).

    ``compile`` is ``torch.compile`` (the tests pass one that counts, or the identity);
    :attr:`compiles` and :attr:`masks_built` count what was done."""

    RECOMPILE_LIMIT = 64

    def __init__(self, flex_attention, create_block_mask, compile=None):
        self._flex_attention = flex_attention
        self._create_block_mask = create_block_mask
        self._compile = compile
        self._compiled = None
        self._masks: dict[tuple, object] = {}
        self.compiles = 0
        self.masks_built = 0

    def compiled(self):
        """The one compiled FlexAttention of this run (compiled on the first call)."""
        if self._compiled is None:
            if self._compile is None:
                _raise_recompile_limit(self.RECOMPILE_LIMIT)
                compile_ = torch.compile
            else:
                compile_ = self._compile
            self._compiled = compile_(self._flex_attention, dynamic=False, fullgraph=True)
            self.compiles += 1
        return self._compiled

    def block_mask(self, seq: int, device, causal: bool):
        """The causal ``BlockMask`` of ``seq`` tokens on ``device`` (built once), or None
        (bidirectional: every block is computed)."""
        if not causal:
            return None
        key = (seq, str(torch.device(device)))
        if key not in self._masks:
            self._masks[key] = self._create_block_mask(
                causal_mask, None, None, seq, seq, device=device
            )
            self.masks_built += 1
        return self._masks[key]

    def attention(self, seq: int, device, causal: bool, score_mod=None, prepare=None):
        """``(q, k, v) -> out``: ``prepare`` (a PyTorch transform, outside the compiled call)
        on q and k, then the compiled FlexAttention with ``score_mod`` and the causal mask;
        tiles as :func:`flex_with_smaller_tiles_on_demand` finds them (``.options``)."""
        compiled = self.compiled()
        block_mask = self.block_mask(seq, device, causal)

        def call(q, k, v, options):
            if prepare is not None:
                q, k = prepare(q), prepare(k)
            return compiled(q, k, v, score_mod=score_mod, block_mask=block_mask,
                            kernel_options=options)  # fmt: skip

        return flex_with_smaller_tiles_on_demand(call)


_FLEX: list = []


def flex_baseline() -> FlexBaseline | None:
    """The run's :class:`FlexBaseline`, or None where the installed PyTorch has no
    FlexAttention."""
    if not _FLEX:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        except ImportError:
            _FLEX.append(None)
        else:
            _FLEX.append(FlexBaseline(flex_attention, create_block_mask))
    return _FLEX[0]


#: The contender of plain attention that checks FlexAttention itself: no ``score_mod``, the
#: causal ``BlockMask``, against SDPA at the same size. Below :data:`SANITY_MIN` x SDPA's speed,
#: the FlexAttention this run compiled is not the one a user gets (not fused, a fallback
#: config...), and every comparison with FlexAttention is reported as unreliable.
FLEX_SANITY = "FlexAttention, no score_mod"
SANITY_MIN = 0.5


def is_flex(contender: str | None) -> bool:
    return contender is not None and "FlexAttention" in contender


def slope_per_distance(table: torch.Tensor, causal: bool) -> torch.Tensor | None:
    """``[heads]`` slopes ``s`` where the bias per distance is ``s_h |j - i|`` (ALiBi's form:
    a user's ``score_mod`` reads one number per head), else None. Only the distances attention
    sees count (``j <= i`` when causal)."""
    seq = (table.shape[-1] + 1) // 2
    if seq < 2:
        return None
    distance = torch.arange(table.shape[-1], device=table.device) - (seq - 1)  # j - i
    seen = distance <= 0 if causal else torch.ones_like(distance, dtype=torch.bool)
    slopes = table[:, seq - 2]  # the bias one token back, |j - i| = 1
    expected = slopes[:, None] * distance.abs()[None].float()
    scale = table[:, seen].abs().max().clamp_min(1e-6)
    if not torch.allclose(table[:, seen], expected[:, seen], rtol=1e-5, atol=1e-6 * scale):
        return None
    return slopes.contiguous()


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
        return transform(x, positions, params).to(x.dtype)

    prefix = "transform + " if transform is not None else ""
    if encoding.score_bias is None:
        if transform is None:
            return "SDPA", sdpa
        return prefix + "SDPA", lambda q, k, v: sdpa(prepare(q), prepare(k), v)
    flex = flex_baseline()
    if flex is None:
        return prefix + "FlexAttention", "this PyTorch has no FlexAttention"
    _, heads, seq, _ = inputs.q.shape
    table = distance_table(encoding, params, heads, seq, inputs.q.device)
    if isinstance(table, str):
        return prefix + "FlexAttention", table
    slopes = slope_per_distance(table, causal)
    if slopes is not None:  # ALiBi's form: one slope per head times the distance

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + slopes[h] * (q_idx - kv_idx).abs()

    else:  # any other bias of the distance: its table, read per distance
        offset = seq - 1

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + table[h, kv_idx - q_idx + offset]

    fn = flex.attention(seq, inputs.q.device, causal, score_mod,
                        prepare if transform is not None else None)  # fmt: skip
    fn.score_mod = "slope per head x distance" if slopes is not None else "table per distance"
    return prefix + "FlexAttention", fn


def sanity_contender(inputs, causal: bool) -> tuple[str, Attention | str]:
    """:data:`FLEX_SANITY`: FlexAttention with no ``score_mod`` on plain attention's inputs."""
    flex = flex_baseline()
    if flex is None:
        return FLEX_SANITY, "this PyTorch has no FlexAttention"
    return FLEX_SANITY, flex.attention(inputs.q.shape[2], inputs.q.device, causal)


#: FlexAttention's own choice first, then smaller tiles, then a single stage: a score_mod that
#: reads a captured table can ask for more shared memory than the GPU has (seen on an H200 with
#: PyTorch 2.11: 245,760 bytes asked, 232,448 there), and Inductor then finds no valid config.
#: Smaller tiles come before fewer stages: one stage serialises every load with the products,
#: and a 128 x 128 tile of gathered bias in 4 warps' registers risks spilling. The options a
#: record ran with are in its ``flex_options``.
FLEX_OPTIONS: tuple[dict | None, ...] = (
    None,
    {"BLOCK_M": 64, "BLOCK_N": 64},
    {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 1},
)


class _SmallerTilesOnDemand:
    """``call(q, k, v, kernel_options)`` as an attention (see
    :func:`flex_with_smaller_tiles_on_demand`)."""

    score_mod: str | None = None

    def __init__(self, call):
        self._call = call
        self._chosen = 0

    @property
    def options(self) -> dict | None:
        """The kernel options the calls run with (None: FlexAttention's own choice)."""
        return FLEX_OPTIONS[self._chosen]

    def __call__(self, q, k, v):
        while True:
            try:
                return self._call(q, k, v, FLEX_OPTIONS[self._chosen])
            except Exception as exc:  # Inductor wraps the resource error in its own types
                text = str(exc)
                if "out of resource" not in text and "No valid triton configs" not in text:
                    raise
                if self._chosen + 1 == len(FLEX_OPTIONS):
                    raise
                self._chosen += 1


def flex_with_smaller_tiles_on_demand(call) -> _SmallerTilesOnDemand:
    """``call(q, k, v, kernel_options)`` as an attention: on an out-of-resources compile error it
    moves to the next entry of :data:`FLEX_OPTIONS` and keeps the first that compiles (its
    ``.options``)."""
    return _SmallerTilesOnDemand(call)


def sdpa_backend(q, k, v, causal: bool, requires_grad: bool = False) -> str:
    """Which backend SDPA runs on these inputs: ``flash``, ``efficient``, ``cudnn`` or ``math``.

    It asks ``torch._fused_sdp_choice``, the function ``scaled_dot_product_attention`` itself
    calls to pick its kernel (same arguments, same ``sdpa_kernel`` settings), then runs SDPA
    restricted to that backend (``torch.nn.attention.sdpa_kernel``) to confirm it accepts these
    inputs; ``"(unconfirmed)"`` is added where it does not, ``unknown (...)`` where this PyTorch
    cannot say."""
    import torch.nn.functional as F

    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        if requires_grad:
            q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
        backend = SDPBackend(torch._fused_sdp_choice(q, k, v, None, 0.0, causal))
    except Exception as exc:  # noqa: BLE001 - a PyTorch without the function: said so
        return f"unknown ({type(exc).__name__})"
    names = {
        "FLASH_ATTENTION": "flash",
        "EFFICIENT_ATTENTION": "efficient",
        "CUDNN_ATTENTION": "cudnn",
        "MATH": "math",
    }
    name = names.get(backend.name, backend.name.lower())
    try:
        with sdpa_kernel([backend]), torch.set_grad_enabled(requires_grad):
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    except RuntimeError:
        return f"{name} (unconfirmed)"
    return name


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


def _step(fn: Attention, inputs, pass_: str) -> tuple[Callable[[], None], list[torch.Tensor]]:
    """One pass of ``fn`` on ``inputs`` as a step, and the leaves whose gradients it fills."""
    if pass_ == "fwd":

        def forward():
            with torch.no_grad():
                fn(inputs.q, inputs.k, inputs.v)

        return forward, []
    leaves = [x.detach().requires_grad_() for x in (inputs.q, inputs.k, inputs.v)]
    leaves += [p for p in inputs.params.values() if torch.is_tensor(p) and p.requires_grad]

    def forward_backward():
        fn(*leaves[:3]).backward(inputs.grad_out)

    return forward_backward, leaves


def time_one(device, fn: Attention, inputs, pass_: str) -> tuple[float, int]:
    """``(ms, peak bytes)`` of one pass of ``fn`` on ``inputs``."""
    return device.measure(*_step(fn, inputs, pass_))


HOST_BUDGET_MS = 200  # host timing of one record: about this long, 3 steps at least


def host_one(device, fn: Attention, inputs, pass_: str, ms: float) -> tuple[float, int]:
    """``(ms the host spends in one pass, reads back to the host in one pass)`` of ``fn``
    (:meth:`.device.Device.host`), a pass of ``ms`` timed about :data:`HOST_BUDGET_MS` long
    (CoPE's backward takes over a second: three of them)."""
    repeats = max(3, min(HOST_REPEATS, int(HOST_BUDGET_MS / max(ms, 1e-3))))
    return device.host(*_step(fn, inputs, pass_), repeats=repeats)


def _record(case: SpeedCase, contender: str, pass_: str) -> dict:
    return dict(
        method=case.label, contender=contender, head_dim=case.head_dim, seq=case.seq,
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
            module_options=dict(case.options),
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
    if encoding is None:  # plain attention also times FlexAttention itself against SDPA
        try:
            contenders.append(sanity_contender(inputs, case.causal))
        except Exception as exc:  # noqa: BLE001
            contenders.append((FLEX_SANITY, f"error: {type(exc).__name__}: {exc}"[:300]))
    for name, fn in contenders:
        for pass_ in PASSES:
            record = _record(case, name, pass_)
            if isinstance(fn, str):
                record["status"] = fn
            else:
                try:
                    ms, peak = time_one(device, fn, inputs, pass_)
                    record.update(ms=ms, peak_mib=peak / 2**20)
                    if name == "kernel":  # what the call costs the host, and its waits
                        host_ms, reads = host_one(device, fn, inputs, pass_, ms)
                        record.update(host_ms=host_ms, host_reads=reads)
                except torch.cuda.OutOfMemoryError:
                    record["status"] = "OOM"
                except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                    record["status"] = f"error: {type(exc).__name__}: {exc}"[:300]
                _describe_contender(record, fn, inputs, case.causal, pass_)
            records.append(record)
    del inputs
    device.free()
    return records


def _describe_contender(record: dict, fn, inputs, causal: bool, pass_: str) -> None:
    """What ran: FlexAttention's kernel options and ``score_mod`` form; SDPA's backend."""
    if is_flex(record["contender"]):
        record["flex_options"] = getattr(fn, "options", None)
        record["flex_score_mod"] = getattr(fn, "score_mod", None) or "none"
    elif record["contender"] == "SDPA":
        record["sdpa_backend"] = sdpa_backend(
            inputs.q, inputs.k, inputs.v, causal, requires_grad=pass_ != "fwd"
        )


def run_speed(device, cases: list[SpeedCase], after_case=None) -> list[dict]:
    """Every case, one after the other (timings alone on the GPU), with a progress bar; the
    ratios added (:func:`add_ratios`). ``after_case(records, done)``, if given, is called after
    each case with the records so far (ratios added) and the number of cases done."""
    from tqdm.auto import tqdm

    records = []
    for done, case in enumerate(tqdm(cases, desc="speed"), start=1):
        records += measure_case(device, case)
        if after_case is not None and done < len(cases):
            add_ratios(records)
            after_case(records, done)
    add_ratios(records)
    return records


def flex_sanity(records: list[dict]) -> dict:
    """The verdict of the :data:`FLEX_SANITY` rows: ``rows`` (size, pass, SDPA's time over
    FlexAttention's), ``worst``, ``reliable`` (every row timed and at least :data:`SANITY_MIN`;
    a run without the rows is not reliable either) and ``reason``."""
    rows = [
        dict(head_dim=r["head_dim"], seq=r["seq"], dtype=r["dtype"], causal=r["causal"],
             pass_=r["pass_"], vs_sdpa=r.get("vs_sdpa"), status=r.get("status", "ok"))
        for r in records
        if r["contender"] == FLEX_SANITY
    ]  # fmt: skip
    timed = [r for r in rows if r["vs_sdpa"] is not None]
    worst = min(timed, key=lambda r: r["vs_sdpa"]) if timed else None
    if not rows:
        reason = "no sanity row: FlexAttention without a score_mod was not timed against SDPA"
    elif len(timed) < len(rows):
        missing = next(r for r in rows if r["vs_sdpa"] is None)
        reason = (f"FlexAttention without a score_mod was not timed at D{missing['head_dim']} "
                  f"N{missing['seq']} {missing['pass_']}: {missing['status']}")  # fmt: skip
    elif worst["vs_sdpa"] < SANITY_MIN:
        reason = (f"FlexAttention without a score_mod ran at {worst['vs_sdpa']:.2f}x SDPA's speed "
                  f"(D{worst['head_dim']} N{worst['seq']} {worst['pass_']}), below "
                  f"{SANITY_MIN}x: not the fused FlexAttention a user runs")  # fmt: skip
    else:
        reason = (f"FlexAttention without a score_mod ran at {worst['vs_sdpa']:.2f}x SDPA's speed "
                  f"or better (at least {SANITY_MIN}x needed)")  # fmt: skip
    reliable = bool(rows) and len(timed) == len(rows) and worst["vs_sdpa"] >= SANITY_MIN
    return dict(rows=rows, worst=worst, threshold=SANITY_MIN, reliable=reliable, reason=reason)


def add_ratios(records: list[dict]) -> None:
    """``vs_sdpa`` on every timed record (SDPA's time at the same size and pass over the
    record's) and ``vs_alternative`` on every timed kernel record (its alternative's time over
    the kernel's); None where either is missing. Where the alternative is FlexAttention and
    :func:`flex_sanity` finds the run's FlexAttention unreliable, ``vs_alternative`` is None
    and the measured ratio is kept as ``vs_alternative_unreliable``, with
    ``alternative_unreliable`` saying why."""

    def key(r):
        return (r["head_dim"], r["seq"], r["causal"], r["dtype"], r["pass_"])

    sdpa = {key(r): r["ms"] for r in records if r["contender"] == "SDPA" and r["ms"]}
    alternatives = {
        (r["method"], *key(r)): (r["contender"], r["ms"])
        for r in records
        if r["contender"] not in ("kernel", "SDPA", "-", FLEX_SANITY) and r["ms"]
    }
    for r in records:
        r.pop("vs_alternative_unreliable", None)
        r.pop("alternative_unreliable", None)
        if not r["ms"]:
            r["vs_sdpa"] = r["vs_alternative"] = None
            continue
        base = sdpa.get(key(r))
        r["vs_sdpa"] = base / r["ms"] if base else None
        name, other = alternatives.get((r["method"], *key(r)), (None, None))
        if r["method"] == "softmax" and r["contender"] == "kernel":
            name, other = "SDPA", base
        r["vs_alternative"] = other / r["ms"] if other and r["contender"] == "kernel" else None
        r["alternative_is_flex"] = is_flex(name) and r["contender"] == "kernel"
    sanity = flex_sanity(records)
    for r in records:
        if r.pop("alternative_is_flex", False) and not sanity["reliable"]:
            r["vs_alternative_unreliable"] = r["vs_alternative"]
            r["vs_alternative"] = None
            r["alternative_unreliable"] = sanity["reason"]
