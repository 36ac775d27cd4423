"""ComRoPE-LD (Yu et al. 2025, "ComRoPE: Scalable and Robust Rotary Position Embedding
Parameterized by Trainable Commuting Angle Matrices", §4): the linearly dependent solution of
the RoPE equation (chapter 09).

As in ComRoPE-AP (:mod:`.comrope_ap`), a head is ``m = D / b`` blocks of ``b`` channels and a
token at ``p = (p_1, ..., p_N)`` is rotated by ``R(p) = exp(sum_i p_i A_i)``, ``A_i =
diag(B_i1, ..., B_im)``. The linearly dependent choice makes the angle matrices of a block
multiples of one learned skew-symmetric matrix::

    B_ij = theta_ij (P_j - P_j^T)

with ``P_j`` learned per block and head and a learned scale ``theta_ij`` per axis and block,
shared by the heads of a layer (as in the authors' code). Multiples of one matrix commute, so
the score depends on the offset only. Every axis turns every block, along one learned plane
structure per block, at its own speed: a block's rotation is ``exp((theta_1j p_1 + theta_2j p_2)
S_j)``, a rotation by an amount linear in a learned direction of the image.

Course conventions, as in :mod:`.comrope_ap`: integer patch coordinates, block ``j`` scaled by
the fixed ``w_j = base**(-j/m)``; ``P_j`` starts with normal entries of std ``init_std`` and
``theta`` with standard normal entries (the authors' initialisation). On the Triton backend the
rotation runs in PyTorch before the plain flash kernel.

Computed axis by axis (:func:`~course_lib.encodings.comrope_ap.apply_block_axes`): a block's
angle matrices are multiples of one skew matrix ``S_j``, which commute, so ``matrix_exp(w_j
sum_i c_ij p_i S_j) = prod_i matrix_exp(w_j c_ij p_i S_j)``; the factor of axis ``i`` depends on
``p_i`` alone, so ``matrix_exp`` runs once per distinct value of each coordinate (a 64 x 64 grid:
64 per axis and block, not 4096 positions), and each factor is gathered and applied as one
batched product.
"""

from __future__ import annotations

import torch
from torch import nn

from course_lib.checks import check_float_tensor
from course_lib.encodings.comrope_ap import AXES, apply_block_axes, check_block_count
from course_lib.encodings.liere import LIERE_BLOCK_SIZE, check_block_base, skew_part
from course_lib.layers import PositionalSelfAttention
from course_lib.registry import REQUIRED, Encoding, register

__all__ = [
    "comrope_ld_generators",
    "comrope_ld_transform",
    "check_comrope_ld_params",
    "ComRoPELDAttention",
]


def comrope_ld_generators(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The angle matrices of ComRoPE-LD per block: ``blocks`` ``[..., m, b, b]`` (``P_j``),
    ``scales`` ``[axes, m]`` (``theta_ij``) -> ``[..., m, axes, b, b]``, ``B_ij = theta_ij
    (P_j - P_j^T)``."""
    skew = 2 * skew_part(blocks)  # [..., m, b, b]
    return scales.transpose(0, 1)[:, :, None, None] * skew.unsqueeze(-3)


# -- hooks of the registry record ----------------------------------------------------------------
def comrope_ld_transform(x: torch.Tensor, positions: torch.Tensor, params: dict) -> torch.Tensor:
    """rotates block j by matrix_exp(w_j (theta_1j p_1 + theta_2j p_2)(P_j - P_j^T)) (ComRoPE-LD)"""
    skews = 2 * skew_part(params["blocks"])  # P_j - P_j^T
    return apply_block_axes(x, positions, skews, params["scales"], base=params["base"])


def check_comrope_ld_params(
    params: dict, *, heads: int, head_dim: int, device, positions=None, **call
) -> None:
    """``blocks``: finite floating ``[heads, m, b, b]``, ``m * b = head_dim`` with ``m`` even;
    ``scales``: finite floating ``[2, m]``; both on the device of q; ``base`` > 0."""
    check_block_base(params["base"])
    blocks = params["blocks"]
    check_float_tensor(blocks, "blocks", "[heads, m, b, b]", device)
    if blocks.dim() != 4 or blocks.shape[0] != heads or blocks.shape[-1] != blocks.shape[-2]:
        raise ValueError(
            f"blocks must be one square b x b matrix per head and block: [heads, m, b, b] = "
            f"[{heads}, m, b, b]; got {tuple(blocks.shape)}"
        )
    check_block_count(head_dim, blocks.shape[-1], "ComRoPE-LD")
    m = blocks.shape[1]
    if m * blocks.shape[-1] != head_dim:
        raise ValueError(
            f"blocks: m = {m} blocks of {blocks.shape[-1]} channels must cover head_dim={head_dim}"
        )
    check_float_tensor(params["scales"], "scales", "[axes, m] (one per axis and block)", device,
                       shape=(AXES, m))  # fmt: skip


class ComRoPELDAttention(PositionalSelfAttention):
    """ComRoPE-LD on q and k: a learned ``P_j`` ``[b, b]`` per head and block (``b = 4``, std
    ``init_std``) and scales ``theta`` ``[2, m]`` per layer (standard normal).
    ``forward(..., position_ids=...)`` needs the (row, column) of every token, ``[seq, 2]`` or
    ``[batch, seq, 2]``."""

    encoding = "comrope_ld"

    def __init__(
        self,
        hidden_size,
        num_heads,
        max_position_embeddings=512,
        dropout=0.0,
        backend="reference",
        block_size: int = LIERE_BLOCK_SIZE,
        init_std: float = 0.5,
    ):
        super().__init__(hidden_size, num_heads, max_position_embeddings, dropout, backend)
        check_block_count(self.head_dim, block_size, "ComRoPELDAttention")
        self.block_size = block_size
        m = self.head_dim // block_size
        self.blocks = nn.Parameter(torch.randn(num_heads, m, block_size, block_size) * init_std)
        self.scales = nn.Parameter(torch.randn(AXES, m))

    def generators(self) -> torch.Tensor:
        """The angle matrices ``[heads, m, 2, b, b]`` of the current parameters."""
        return comrope_ld_generators(self.blocks, self.scales)

    def attention_params(self, hidden_states: torch.Tensor) -> dict:
        return {"blocks": self.blocks, "scales": self.scales}


register(
    Encoding(
        name="comrope_ld",
        chapter="09_two_dimensions",
        summary="ComRoPE-LD: each block of 4 channels turns by one learned rotation, at a learned "
        "speed per axis (the paper's linearly dependent form; relative)",
        module=ComRoPELDAttention,
        color="#9c9ede",
        qk_transform=comrope_ld_transform,
        params={"blocks": REQUIRED, "scales": REQUIRED, "base": 100.0},
        check_params=check_comrope_ld_params,
        relative=True,
        learnable=True,
        position_dims=2,
    )
)
