"""The encoding registry: one record per encoding, and every other part of the course reads it.

Position can enter attention in four places, and an :class:`Encoding` says what it does in each::

    1. inputs      h_qk, h_v = inputs(h, p)              (absolute sinusoid, learned table)
    2. q/k         q'_i = T(p_i) q_i,  k'_j = T(p_j) k_j  (RoPE, ExpoSB's gains, 2D RoPE, ...)
    3. score bias  s_ij = scale * q'_i . k'_j + b(i, j)   (ExpoSB's distance factor, RSE, ALiBi, T5)
                   s_ij += c(s, q')_ij                    (a bias read off the scores: CoPE)
    4. normaliser  A_i = softmax(s_i) or stick-breaking(s_i)

Place 1 is done by the encoding's attention module (it owns the parameters), places 2-4 by
:func:`course_lib.attention.attention`, which composes the record's hooks, and by the fused
kernels, which take the tables and bias the record's kernel hooks build.

The record lives in the encoding's own file under :mod:`course_lib.encodings`, which calls
:func:`register`; nothing else in the course keeps a list of encoding names. This module imports
nothing of the course, so every other module can read the registry without an import cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = [
    "Encoding",
    "REGISTRY",
    "REQUIRED",
    "NORMALISER_NAMES",
    "register",
    "unregister",
    "get_encoding",
    "attention_methods",
    "sequence_encodings",
]

NORMALISER_NAMES: tuple[str, ...] = ("softmax", "stick_breaking")


class _Required:
    """Marks an attention parameter that has no default (e.g. RSE's ``distance_penalty``)."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()


@dataclass(frozen=True)
class Encoding:
    """One positional encoding: what it does in each of the four places, and what it claims.

    Identity: ``name`` (the key everywhere: ``get_attention_class(name)``, the comparison, the
    figures), ``summary`` (one line), ``color`` (its colour in every figure), ``module`` (its
    attention module class, built on :class:`course_lib.layers.PositionalSelfAttention`), and
    optionally ``chapter`` (the notebook that teaches it, e.g. ``"06_score_biases"``: the registry
    lists encodings in the course's order by it; one without a chapter comes after them).

    The four places (None: the encoding does nothing there):

    * ``inputs``: a sentence saying what the module adds to the projections' inputs.
    * ``qk_transform(x, positions, params) -> x'``: ``x`` ``[batch, heads, seq, head_dim]``,
      ``positions`` integer ``[1 or batch, seq]``; applied to q with the query positions and to
      k with the key positions, unless ``key_transform(x, positions, params) -> x'`` gives keys a
      transform of their own (xPos scales queries up and keys down with the position).
    * ``score_bias(query_positions, key_positions, params) -> bias`` broadcastable to
      ``[batch, heads, seq_q, seq_k]``, added to the scaled scores; or, for a bias that depends on
      the positions only through ``p_i - p_j``, ``distance_bias(distances, params) -> [heads or 1,
      *distances.shape]`` (``distances`` an int64 tensor of ``p_i - p_j``, any shape; signed:
      take ``.abs()`` for a symmetric bias), from which the record derives ``score_bias`` and
      which the kernels read as a table (ALiBi, T5, KERPLE). Give one of the two. With
      ``distance_bias``, ``distance_reach(params) -> int | None``: the distance from which the
      bias no longer changes, one value per head **for any parameters** (T5's last bucket), or
      None; a causal launch of the flash kernels then takes every tile past it as one constant
      (:func:`course_lib.kernel_hooks.distance_score_bias`).
    * ``score_bias_from_scores(scores, q, allowed, params) -> bias``: a bias that depends on the
      scores themselves, computed after the positional bias above and added to the scores:
      ``scores`` ``[batch, heads, seq_q, seq_k]``, ``q`` the queries after the q/k transform
      (unscaled) ``[batch, heads, seq_q, head_dim]``, ``allowed`` bool, broadcastable to the
      scores: the keys each query may see (causal and padding masks). CoPE counts its positions
      with gates read off the scores. Softmax normaliser only; on the Triton backend it needs an
      attention kernel of its own (``kernel_attention``) or a ``kernel_support`` sentence.
    * ``normaliser``: ``"softmax"`` or ``"stick_breaking"`` (the leftover stick goes to the
      query's own value).

    ``params``: the keyword parameters ``attention(method=name, ...)`` takes, with defaults
    (:data:`REQUIRED` for none); ``check_params(params, *, heads, head_dim, device, causal, positions, batch)``
    validates them, and may fill in a default that depends on the call (e.g. one value per head)
    or a value derived from it (xPos adds ``centre``, the middle of each sequence's positions).
    ``per_key_params``: those that hold one value per key on their last axis (a term the module
    computes from each token, e.g. FoX's forget gates): a key/value cache keeps them with the keys.

    Kernel hooks (see :mod:`course_lib.kernel_hooks`): ``kernel_tables(positions, head_dim,
    params) -> QKTables`` (an elementwise pairwise transform the kernels fuse into their tile
    loads; its key tables may differ from the query's); ``kernel_bias(params, positions) ->
    ScoreBias`` (``positions`` the checked key positions ``[1 or batch, seq]``, or the token
    indices for an encoding that reads none): the fused form of the score bias, required with
    ``score_bias`` and optional with ``distance_bias`` (without it the kernels read the distance
    bias from a table, :func:`course_lib.kernel_hooks.distance_score_bias`; a specialised hook is
    worth it where it is faster); ``kernel_hooks``: every score-bias hook object
    ``kernel_bias`` may hand the kernels (defined in the encoding's file behind the Triton guard,
    empty without Triton), so that the static GPU report finds them.
    ``kernel_attention(q, k, v, *, causal, key_padding_mask, position_ids, scale, params) ->
    out`` (``position_ids`` None when the encoding reads none): a fused attention of the
    encoding's own (a kernel family of its own, e.g. CoPE's scan over the keys), which the Triton
    backend calls instead of the flash or stick-breaking kernels. A
    ``qk_transform`` without ``kernel_tables`` (a dense rotation per token, LieRE) is applied to q
    and k by PyTorch before the plain kernel, with autograd through it. An encoding whose
    attention part has no kernel sets ``kernel_support`` to a sentence saying why, and the Triton
    backend refuses it with that sentence. ``speed_variants``: module keyword arguments of extra
    cases the GPU check times (``python -m course_lib.gpu_check``) besides the module's defaults,
    each labelled with its arguments (CoPE's table at the length the course trains, where the
    default table is as long as the sequence).

    Claims, checked for every record by the conformance checks (:mod:`course_lib.conformance`):
    ``relative`` (shift-invariant: shifting every position of a sequence by the same amount
    changes nothing; true of anything that reads positions only through ``p_i - p_j``, and also of
    a bias that counts positions from the sequence's first key), ``distance_only`` (its score bias,
    place 3, is a function of ``p_i - p_j`` alone, one value per diagonal: what lets a baseline
    such as FlexAttention read it from a table per distance; None: True exactly when
    ``distance_bias`` is given; a record without a score bias cannot claim it), ``causal_only``
    (no bidirectional form), ``learnable`` (it has trainable parameters).
    ``position_dims``: coordinates per token, 1 (a sequence: ``position_ids`` ``[seq]``) or 2 (an
    image: ``[seq, 2]``, the (row, column) of each patch; there is no default).
    ``reads_positions``: set it to False for a score bias computed from content alone.
    """

    name: str
    summary: str
    module: type
    color: str
    chapter: str | None = None
    inputs: str | None = None
    qk_transform: Callable | None = None
    key_transform: Callable | None = None
    score_bias: Callable | None = None
    distance_bias: Callable | None = None
    distance_reach: Callable | None = None
    score_bias_from_scores: Callable | None = None
    normaliser: str = "softmax"
    params: Mapping[str, object] = field(default_factory=dict)
    per_key_params: tuple[str, ...] = ()
    check_params: Callable | None = None
    kernel_tables: Callable | None = None
    kernel_bias: Callable | None = None
    kernel_hooks: tuple = ()
    kernel_attention: Callable | None = None
    kernel_support: str | None = None
    speed_variants: tuple = ()
    relative: bool = False
    distance_only: bool | None = None
    causal_only: bool = False
    learnable: bool = False
    position_dims: int = 1
    reads_positions: bool | None = None

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"an encoding name must be an identifier, got {self.name!r}")
        if self.normaliser not in NORMALISER_NAMES:
            raise ValueError(
                f"{self.name}: normaliser must be one of {NORMALISER_NAMES}, got {self.normaliser!r}"
            )
        if self.position_dims not in (1, 2):
            raise ValueError(f"{self.name}: position_dims must be 1 or 2, got {self.position_dims}")
        if self.name == "softmax":
            raise ValueError("'softmax' names the plain attention method; pick another name")
        if self.key_transform is not None and self.qk_transform is None:
            raise ValueError(f"{self.name}: key_transform needs a qk_transform for the queries")
        if self.distance_bias is not None:
            derived = getattr(self.score_bias, "distance_bias", None) is self.distance_bias
            if self.score_bias is not None and not derived:  # (replace() passes it back)
                raise ValueError(
                    f"{self.name}: give score_bias or distance_bias, not both (the record derives "
                    "score_bias from distance_bias)"
                )
            object.__setattr__(self, "score_bias", _bias_of_distance(self.distance_bias))
        elif self.distance_reach is not None:
            raise ValueError(f"{self.name}: distance_reach describes a distance_bias; give both")
        elif self.score_bias is not None and self.kernel_bias is None and not self.kernel_support:
            raise ValueError(f"{self.name}: score_bias needs kernel_bias (or kernel_support)")
        object.__setattr__(self, "kernel_hooks", tuple(self.kernel_hooks))
        object.__setattr__(
            self, "speed_variants", tuple(MappingProxyType(dict(v)) for v in self.speed_variants)
        )
        if self.distance_only is None:
            object.__setattr__(self, "distance_only", self.distance_bias is not None)
        elif self.distance_only and self.score_bias is None:
            raise ValueError(
                f"{self.name}: distance_only describes a score bias, and this record has none"
            )
        elif not self.distance_only and self.distance_bias is not None:
            raise ValueError(
                f"{self.name}: a bias given as distance_bias is a function of the distance; "
                "drop distance_only=False"
            )
        if self.score_bias_from_scores is not None:
            if self.normaliser != "softmax":
                raise ValueError(
                    f"{self.name}: score_bias_from_scores is composed with the softmax normaliser "
                    "only"
                )
            if self.kernel_attention is None and not self.kernel_support:
                raise ValueError(
                    f"{self.name}: score_bias_from_scores needs kernel_attention (or "
                    "kernel_support)"
                )
        object.__setattr__(self, "params", MappingProxyType(dict(self.params)))

    @property
    def acts_in_attention(self) -> bool:
        """True if it changes attention itself (places 2-4), so it is an ``attention`` method."""
        return (
            self.qk_transform is not None
            or self.score_bias is not None
            or self.score_bias_from_scores is not None
            or self.normaliser != "softmax"
        )

    @property
    def method(self) -> str:
        """The ``attention(method=...)`` name its modules use: its own name, or ``"softmax"``
        when its position signal lives in the inputs (or nowhere)."""
        return self.name if self.acts_in_attention else "softmax"

    @property
    def uses_positions(self) -> bool:
        """True if attention reads position ids: ``reads_positions`` if given, else whether it
        has a q/k transform or a score bias (a bias from content alone, FoX's, reads none)."""
        if self.reads_positions is not None:
            return self.reads_positions
        return self.qk_transform is not None or self.score_bias is not None

    def places(self) -> dict[str, str]:
        """What it does in each place, in words (for tables in the notebooks)."""

        def doc(fn: Callable | None) -> str:
            if fn is None:
                return "-"
            return (fn.__doc__ or fn.__name__).strip().splitlines()[0]

        return {
            "inputs": self.inputs or "-",
            "q/k": doc(self.qk_transform),
            "score bias": doc(self.score_bias or self.score_bias_from_scores),
            "normaliser": self.normaliser,
        }


def _bias_of_distance(distance_bias: Callable) -> Callable:
    """``score_bias`` from ``distance_bias``: ``b[..., h, i, j] = distance_bias(p_i - p_j)[h]``."""

    def score_bias(query_positions, key_positions, params):
        distances = query_positions.unsqueeze(-1) - key_positions.unsqueeze(-2)  # [1|B, Nq, Nk]
        return distance_bias(distances, params).movedim(0, 1)  # [1|B, H or 1, Nq, Nk]

    score_bias.__doc__ = distance_bias.__doc__
    score_bias.__name__ = distance_bias.__name__
    score_bias.distance_bias = distance_bias
    return score_bias


_REGISTRY: dict[str, Encoding] = {}
REGISTRY: Mapping[str, Encoding] = MappingProxyType(_REGISTRY)
"""Every encoding the course teaches, ``name -> Encoding``, in the course's order (by chapter,
then in the order they were registered). Read-only: add one with :func:`register`."""


def register(encoding: Encoding) -> Encoding:
    """Add ``encoding`` to :data:`REGISTRY` (its name must be new); return it."""
    if not isinstance(encoding, Encoding):
        raise TypeError(f"register() takes an Encoding, got {type(encoding).__name__}")
    if encoding.name in _REGISTRY:
        raise ValueError(f"an encoding named {encoding.name!r} is already registered")
    _REGISTRY[encoding.name] = encoding
    in_course_order = sorted(  # stable; encodings without a chapter after the course's
        _REGISTRY.values(), key=lambda e: (e.chapter is None, e.chapter or "")
    )
    _REGISTRY.clear()
    _REGISTRY.update((e.name, e) for e in in_course_order)
    return encoding


def unregister(name: str) -> Encoding:
    """Remove and return an encoding (for tests that register a temporary one)."""
    return _REGISTRY.pop(get_encoding(name).name)


def get_encoding(name: str) -> Encoding:
    """The record of ``name``; an unknown name raises a ValueError listing the valid ones."""
    if name not in _REGISTRY:
        valid = ", ".join(map(repr, _REGISTRY))
        raise ValueError(f"unknown encoding {name!r}; valid: {valid}")
    return _REGISTRY[name]


def attention_methods() -> dict[str, Encoding | None]:
    """``attention(method=...)`` names: ``"softmax"`` (no position signal in attention, None)
    and every encoding that acts in attention itself."""
    methods: dict[str, Encoding | None] = {"softmax": None}
    methods.update({name: e for name, e in _REGISTRY.items() if e.acts_in_attention})
    return methods


def sequence_encodings() -> tuple[str, ...]:
    """The names of the encodings of token sequences (``position_dims == 1``), in course order:
    what a language model such as ``MiniBert`` can use (the others place image patches)."""
    return tuple(name for name, e in _REGISTRY.items() if e.position_dims == 1)
