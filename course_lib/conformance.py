"""The conformance checks every registered encoding passes, as a public function.

``check_encoding(name)`` runs them on one encoding and returns a :class:`ConformanceReport`
(printable, and a table in a notebook); ``tests/test_registry_conformance.py`` runs every check on
every registered encoding. Each check is a function ``check(name) -> str`` that returns what it
verified, raises :class:`AssertionError` saying what went wrong, or :class:`Skipped` saying why it
does not apply::

    shapes        attention() and the module keep [batch, heads, seq, head_dim] / [batch, seq, hidden]
    causal mask   changing later tokens leaves earlier outputs unchanged
    permutation   only an encoding with no position signal is permutation-equivariant
    shift         shifting every position changes nothing exactly when the record says ``relative``
    distance      the score bias is one value per diagonal i - j exactly when it says ``distance_only``
    learnable     the module has parameters beyond the projections exactly when it says ``learnable``
    padding       padded keys do not change the real tokens' outputs
    decoding      cached decoding, one token at a time, equals the full pass
    gradients     float64 gradcheck of q, k, v and the encoding's own parameters (padding, offsets)
    errors        bad input raises a clear error (unknown parameter, shape, positions, mask, ...)
    triton        the fused kernels equal the reference, forward and backward (every parameter)
    generation    a model on the fused kernels generates what the reference one does

The inputs are small and seeded (a few milliseconds each in the reference, seconds in Triton's
CPU interpreter), the modules' own parameters moved away from their initial values so that a
gradient that should matter does.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.autograd.gradcheck import GradcheckError

from course_lib.attention import attention, get_attention_class
from course_lib.model import BertConfig, MiniBert
from course_lib.registry import REQUIRED, get_encoding
from course_lib.runtime import kernel_device, kernels_available

__all__ = ["CHECKS", "Check", "ConformanceReport", "Skipped", "check_encoding"]

PROJECTIONS = ("query", "key", "value", "out")


class Skipped(Exception):
    """A check that does not apply to this encoding (the message says why)."""


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def causal_modes(name: str) -> list[bool]:
    """The masks an encoding allows: causal and bidirectional, or causal only."""
    return [True] if get_encoding(name).causal_only else [True, False]


def own_parameters(module: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The module's trainable parameters beyond the q, k, v and output projections: the
    encoding's own (``name -> parameter``)."""
    return {pname: p for pname, p in module.named_parameters()
            if p.requires_grad and pname.split(".")[0] not in PROJECTIONS}  # fmt: skip


def make_module(name, hidden=32, heads=4, dtype=torch.float64, backend="reference", seed=0):
    """The encoding's module, with its own parameters drawn from N(0, 0.5) instead of their
    initial values (so a gradient or a penalty that should matter does)."""
    torch.manual_seed(seed)
    module = get_attention_class(name)(hidden, heads, max_position_embeddings=64, backend=backend)
    with torch.no_grad():
        for p in own_parameters(module).values():
            p.normal_(0.0, 0.5, generator=_gen(seed + 1))
    return module.to(dtype)


def example_params(name, heads, dtype=torch.float64, seed=0, batch=1, seq=3) -> dict:
    """The keyword parameters ``attention(method=name)`` needs for ``batch`` sequences of ``seq``
    tokens, taken from the encoding's module (leaf tensors, so gradients can be checked against
    them; per-key ones are computed from random hidden states)."""
    hidden = 8 * heads
    module = make_module(name, hidden=hidden, heads=heads, dtype=dtype, seed=seed)
    x = torch.randn(batch, seq, hidden, generator=_gen(seed), dtype=dtype)
    params = module.attention_params(x)
    return {
        key: value.detach().clone().requires_grad_() if torch.is_tensor(value) else value
        for key, value in params.items()
    }


def positions(name: str, seq: int, offset: int = 0) -> torch.Tensor:
    """Positions of ``seq`` tokens: ``arange(seq) + offset``, or for two coordinates per token
    the (row, column) of a grid 4 columns wide, both shifted by ``offset``."""
    index = torch.arange(seq)
    if get_encoding(name).position_dims == 1:
        return index + offset
    return torch.stack((index // 4, index % 4), dim=-1) + offset


def positions_kw(name: str, seq: int, offset: int = 0) -> dict:
    """``position_ids`` for :func:`attention`, if the encoding reads positions."""
    used = get_encoding(name).uses_positions
    return {"position_ids": positions(name, seq, offset)} if used else {}


def module_positions_kw(name: str, seq: int, offset: int = 0) -> dict:
    """What a module needs: positions are optional for sequences, required for 2-D tokens."""
    needed = get_encoding(name).position_dims != 1 or offset
    return {"position_ids": positions(name, seq, offset)} if needed else {}


def _expect_error(kind: type[Exception], pattern: str, call: Callable[[], object]) -> None:
    """``call()`` must raise ``kind`` with a message matching ``pattern``."""
    try:
        call()
    except kind as exc:
        if not re.search(pattern, str(exc)):
            raise AssertionError(
                f"expected a {kind.__name__} saying {pattern!r}, got: {exc}"
            ) from exc
        return
    raise AssertionError(f"expected a {kind.__name__} saying {pattern!r}; nothing was raised")


def _close(actual, expected, what: str, **tolerances) -> None:
    try:
        torch.testing.assert_close(actual, expected, **tolerances)
    except AssertionError as exc:
        raise AssertionError(f"{what}: {exc}") from None


# -- the checks ---------------------------------------------------------------------------------


def check_shapes(name: str) -> str:
    spec = get_encoding(name)
    module = make_module(name)
    x = torch.randn(2, 7, 32, generator=_gen(2), dtype=torch.float64)
    out = module(x, causal=spec.causal_only, **module_positions_kw(name, 7))
    assert out.shape == x.shape, f"the module returned {tuple(out.shape)} for {tuple(x.shape)}"
    q, k, v = torch.randn(3, 2, 2, 7, 8, generator=_gen(2), dtype=torch.float64).unbind(0)
    params = example_params(name, heads=2, batch=2, seq=7)
    a = attention(q, k, v, method=spec.method, causal=spec.causal_only,
                  **positions_kw(name, 7), **params)  # fmt: skip
    assert a.shape == q.shape, f"attention() returned {tuple(a.shape)} for {tuple(q.shape)}"
    return "module [2, 7, 32] -> [2, 7, 32]; attention() [2, 2, 7, 8] -> [2, 2, 7, 8]"


def check_causal_mask(name: str) -> str:
    module = make_module(name)
    x = torch.randn(1, 9, 32, generator=_gen(12), dtype=torch.float64)
    changed = x.clone()
    changed[:, 5:] = torch.randn(1, 4, 32, generator=_gen(13), dtype=torch.float64)
    kw = module_positions_kw(name, 9)
    before, after = module(x, causal=True, **kw), module(changed, causal=True, **kw)
    _close(after[:, :5], before[:, :5], "tokens 0-4 changed when tokens 5-8 did", atol=1e-10,
           rtol=0)  # fmt: skip
    assert not torch.allclose(after[:, 5:], before[:, 5:]), "tokens 5-8 did not change"
    return "causal: changing tokens 5-8 leaves tokens 0-4 as they were (1e-10)"


def check_permutation(name: str) -> str:
    spec = get_encoding(name)
    module = make_module(name)
    x = torch.randn(2, 10, 32, generator=_gen(3), dtype=torch.float64)
    perm = torch.randperm(10, generator=_gen(4))
    kw = {"causal": spec.causal_only, **module_positions_kw(name, 10)}
    equivariant = torch.allclose(module(x[:, perm], **kw), module(x, **kw)[:, perm], atol=1e-10)
    no_signal = spec.inputs is None and not spec.acts_in_attention
    expected = no_signal and not spec.causal_only
    assert equivariant == expected, (
        f"permuting the tokens {'permutes' if equivariant else 'changes'} the outputs, but the "
        f"encoding {'has no' if no_signal else 'has a'} position signal"
        + (" and is causal only" if spec.causal_only else "")
    )
    return "permutation-equivariant" if equivariant else "not permutation-equivariant (positions)"


def check_shift(name: str) -> str:
    spec = get_encoding(name)
    module = make_module(name)
    x = torch.randn(1, 8, 32, generator=_gen(5), dtype=torch.float64)
    for causal in causal_modes(name):
        base = module(x, causal=causal, position_ids=positions(name, 8))
        shifted = module(x, causal=causal, position_ids=positions(name, 8, offset=40))
        invariant = torch.allclose(base, shifted, atol=1e-8)
        assert invariant == spec.relative, (
            f"{'causal' if causal else 'bidirectional'}: shifting every position by 40 "
            f"{'changes nothing' if invariant else 'changes the outputs'}, but the record says "
            f"relative={spec.relative}"
        )
    return ("shifting every position by 40 changes nothing (relative)" if spec.relative
            else "shifting every position changes the outputs (absolute)")  # fmt: skip


def check_distance(name: str) -> str:
    spec = get_encoding(name)
    if spec.score_bias is None:
        raise Skipped("no score bias (place 3): nothing to be a function of the distance")
    if spec.position_dims != 1:
        raise Skipped("its positions are 2-D: the distance is not one number")
    along_diagonals = True
    for step in (1, 37, 1000):  # far positions too, where a bias may change its form (FIRE's L)
        p = positions(name, 9)[None] * step
        for causal in causal_modes(name):
            params = {**spec.params, "scale": None, **example_params(name, heads=2, seq=9)}
            if spec.check_params is not None:  # the defaults attention() derives, filled in
                spec.check_params(params, heads=2, head_dim=8, device=torch.device("cpu"),
                                  causal=causal, positions=p, batch=1)  # fmt: skip
            with torch.no_grad():
                bias = torch.as_tensor(spec.score_bias(p, p, params)).double()  # [1|B, H|1, 9, 9]
            along_diagonals &= torch.equal(bias[..., 1:, 1:], bias[..., :-1, :-1])
    assert along_diagonals == spec.distance_only, (
        f"its score bias over 9 positions (steps 1, 37, 1000) {'is' if along_diagonals else 'is not'} constant "
        f"along each diagonal i - j, but the record says distance_only={spec.distance_only}"
    )
    return ("its score bias is one value per distance i - j (distance_only)" if along_diagonals
            else "its score bias depends on more than the distance i - j")  # fmt: skip


def check_learnable(name: str) -> str:
    spec = get_encoding(name)
    own = list(own_parameters(make_module(name)))
    found = f"trainable parameters of its own ({', '.join(own)})" if own else "none of its own"
    assert bool(own) == spec.learnable, (
        f"the module has {found} beyond the projections, but the record says "
        f"learnable={spec.learnable}"
    )
    if not own:
        return "no trainable parameters beyond the projections (not learnable)"
    shown = ", ".join(own[:3]) + (f" and {len(own) - 3} more" if len(own) > 3 else "")
    return f"trainable parameters of its own: {shown} (learnable)"


def check_padding(name: str) -> str:
    module = make_module(name)
    x = torch.randn(1, 6, 32, generator=_gen(6), dtype=torch.float64)
    noise = torch.Generator().manual_seed(14)
    for causal in causal_modes(name):
        ref = module(x, causal=causal, **module_positions_kw(name, 6))
        for extra in (2, 7):
            padding = torch.randn(1, extra, 32, generator=noise, dtype=torch.float64) * 10
            xp = torch.cat((x, padding), 1)
            mask = torch.arange(6 + extra)[None] < 6
            kw = module_positions_kw(name, 6 + extra)
            out = module(xp, attention_mask=mask, causal=causal, **kw)[:, :6]
            _close(out, ref, f"{extra} padded keys changed the real tokens")
    return "2 and 7 padded keys (values x10) leave the 6 real tokens unchanged"


def check_decoding(name: str) -> str:
    if get_encoding(name).position_dims != 1:
        raise Skipped("decoding is for sequences; this encoding places tokens in 2-D")
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=40, hidden_size=32, num_layers=2, num_heads=4, encoding=name,
        objective="clm", max_position_embeddings=32,
    )  # fmt: skip
    model = MiniBert(config).double().eval()
    ids = torch.randint(0, 40, (2, 11), generator=_gen(1))
    full = model(ids).logits
    cache = model.new_cache()
    pieces = [model(ids[:, :4], cache=cache).logits]
    for t in range(4, 11):
        pieces.append(model(ids[:, t : t + 1], cache=cache).logits)
    _close(torch.cat(pieces, 1), full, "cached decoding", atol=1e-10, rtol=1e-10)
    assert cache[0].length == 11, f"the cache holds {cache[0].length} tokens, expected 11"
    return "a 4-token prompt, then 7 tokens one at a time: equal to the full pass (1e-10)"


def check_gradients(name: str) -> str:
    spec = get_encoding(name)
    q, k, v = (
        t.requires_grad_()
        for t in torch.randn(3, 1, 2, 5, 8, generator=_gen(7), dtype=torch.float64)
    )
    params = example_params(name, heads=2, seq=5)
    tensors = {key: p for key, p in params.items() if torch.is_tensor(p)}
    mask = torch.tensor([[True, True, False, True, True]])
    for causal in causal_modes(name):

        def fn(q, k, v, *values, causal=causal):
            kw = {**params, **dict(zip(tensors, values, strict=True))}
            return attention(
                q, k, v, method=spec.method, causal=causal, key_padding_mask=mask,
                **positions_kw(name, 5, offset=2), **kw,
            )  # fmt: skip

        try:
            torch.autograd.gradcheck(fn, (q, k, v, *tensors.values()), fast_mode=True)
        except GradcheckError as exc:
            mode = "causal" if causal else "bidirectional"
            raise AssertionError(f"{mode}: {exc}") from None
    inputs = ", ".join(["q", "k", "v", *tensors]) or "q, k, v"
    return f"float64 gradcheck of {inputs} (a padded key, positions from 2)"


def check_errors(name: str) -> str:
    spec = get_encoding(name)
    q, k, v = torch.randn(3, 2, 2, 6, 8, generator=_gen(8)).unbind(0)
    params = example_params(name, heads=2, dtype=torch.float32, batch=2, seq=6)
    method = spec.method
    params = {**params, "causal": spec.causal_only}
    tried = ["an unknown parameter", "3-D q"]
    _expect_error(TypeError, "takes no parameter",
                  lambda: attention(q, k, v, method=method, not_a_parameter=1.0, **params))  # fmt: skip
    _expect_error(ValueError, "4-D", lambda: attention(q[0], k[0], v[0], method=method, **params))
    if spec.uses_positions:
        tried.append("positions of the wrong length")
        _expect_error(ValueError, "position_ids must have shape",
                      lambda: attention(q, k, v, method=method, position_ids=positions(name, 5),
                                        **params))  # fmt: skip
    else:
        tried.append("positions it does not read")
        _expect_error(ValueError, "uses no position ids",
                      lambda: attention(q, k, v, method=method, position_ids=torch.arange(6),
                                        **params))  # fmt: skip
    if spec.causal_only:
        tried.append("a bidirectional mask")
        _expect_error(ValueError, "causal only",
                      lambda: attention(q, k, v, method=method, **{**params, "causal": False}))  # fmt: skip
    for key, default in spec.params.items():
        if default is REQUIRED:
            tried.append(f"no {key}")
            rest = {p: value for p, value in params.items() if p != key}
            _expect_error(ValueError, f"needs {key}",
                          lambda rest=rest: attention(q, k, v, method=method, **rest))  # fmt: skip
    tried.append("a misspelt name")
    _expect_error(ValueError, "valid:", lambda: get_attention_class(name + "_misspelt"))
    return "clear errors for " + ", ".join(tried)


def _needs_kernel(name: str) -> None:
    if not kernels_available():
        raise Skipped("Triton is not installed (it ships wheels for Linux only)")
    if get_encoding(name).kernel_support:
        raise Skipped(f"no kernel: {get_encoding(name).kernel_support}")


def check_triton(name: str) -> str:
    _needs_kernel(name)
    device = kernel_device()
    reference = make_module(name, hidden=32, heads=2, dtype=torch.float32).to(device)
    fused = make_module(name, hidden=32, heads=2, dtype=torch.float32, backend="triton").to(device)
    fused.load_state_dict(reference.state_dict())
    x = torch.randn(2, 21, 32, generator=_gen(9)).to(device)
    mask = (torch.arange(21)[None] < torch.tensor([[21], [17]])).to(device)
    upstream = torch.randn(2, 21, 32, generator=_gen(10)).to(device)
    for causal in causal_modes(name):
        results = []
        for module in (reference, fused):
            xi = x.clone().requires_grad_()
            kw = {"position_ids": positions(name, 21, offset=3)}
            out = module(xi, attention_mask=mask, causal=causal, **kw)
            grads = torch.autograd.grad((out * upstream).sum(), [xi, *module.parameters()])
            results.append((out, grads))
        (out_ref, grads_ref), (out_tri, grads_tri) = results
        mode = "causal" if causal else "bidirectional"
        _close(out_tri, out_ref, f"{mode} output", atol=1e-4, rtol=1e-4)
        names = ["input", *(n for n, _ in reference.named_parameters())]
        for pname, g_tri, g_ref in zip(names, grads_tri, grads_ref, strict=True):
            _close(g_tri, g_ref, f"{mode} gradient of {pname}", atol=2e-4, rtol=1e-3)
    return ("fused == reference on 21 tokens (one sequence padded to 17), float32: outputs to "
            "1e-4, the gradients of the input and of every parameter to 2e-4 + 1e-3 relative")  # fmt: skip


def check_generation(name: str) -> str:
    if get_encoding(name).position_dims != 1:
        raise Skipped("generation is for sequences; this encoding places tokens in 2-D")
    _needs_kernel(name)
    config = dict(
        vocab_size=40, hidden_size=32, num_layers=2, num_heads=2, encoding=name,
        objective="clm", max_position_embeddings=32,
    )  # fmt: skip
    torch.manual_seed(0)
    reference = MiniBert(BertConfig(**config)).eval()
    fused = MiniBert(BertConfig(**config, backend="triton")).eval()
    fused.load_state_dict(reference.state_dict())
    device = kernel_device()
    prompt = torch.randint(0, 40, (2, 5), generator=_gen(11)).to(device)
    _close(fused.to(device).generate(prompt, 4), reference.to(device).generate(prompt, 4),
           "generated tokens")  # fmt: skip
    return "a model on the fused kernels generates the reference's 4 tokens"


#: Every check, in the order a report lists them: ``name -> check(encoding name) -> str``.
CHECKS: dict[str, Callable[[str], str]] = {
    "shapes": check_shapes,
    "causal mask": check_causal_mask,
    "permutation": check_permutation,
    "shift": check_shift,
    "distance": check_distance,
    "learnable": check_learnable,
    "padding": check_padding,
    "decoding": check_decoding,
    "gradients": check_gradients,
    "errors": check_errors,
    "triton": check_triton,
    "generation": check_generation,
}


@dataclass
class Check:
    """One check's outcome: ``status`` ``"pass"``, ``"FAIL"`` or ``"skip"``, and what it saw."""

    name: str
    status: str
    detail: str
    seconds: float


@dataclass
class ConformanceReport:
    """The outcome of :func:`check_encoding`; ``passed`` when no check failed."""

    encoding: str
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.status != "FAIL" for c in self.checks)

    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status == "FAIL"]

    def __str__(self) -> str:
        width = max((len(c.name) for c in self.checks), default=0)
        lines = [f"conformance of {self.encoding!r}: "
                 + ("every check passed" if self.passed
                    else f"{len(self.failures())} check(s) FAILED")]  # fmt: skip
        lines += [f"  {c.status:4}  {c.name:{width}}  {c.detail}" for c in self.checks]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)


def _summary(exc: Exception, limit: int = 400) -> str:
    """An exception's message on one line (its type named unless it is a failed check)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = "; ".join(lines) or "failed"
    if not isinstance(exc, AssertionError):
        text = f"{type(exc).__name__}: {text}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_encoding(name: str, checks: list[str] | None = None) -> ConformanceReport:
    """Run the conformance checks (all of :data:`CHECKS`, or those named) on the registered
    encoding ``name`` and return a report; a failing check is reported, not raised (call
    ``report.passed``). An unknown encoding or check name raises ``ValueError``."""
    get_encoding(name)  # raises, listing the valid names
    chosen = list(CHECKS) if checks is None else list(checks)
    unknown = [c for c in chosen if c not in CHECKS]
    if unknown:
        raise ValueError(f"unknown check(s) {unknown}; valid: {list(CHECKS)}")
    report = ConformanceReport(name)
    for check in chosen:
        start = time.perf_counter()
        try:
            status, detail = "pass", CHECKS[check](name)
        except Skipped as exc:
            status, detail = "skip", str(exc)
        except Exception as exc:  # noqa: BLE001 - a learner's encoding may raise anything
            status, detail = "FAIL", _summary(exc)
        report.checks.append(Check(check, status, detail, time.perf_counter() - start))
    return report
