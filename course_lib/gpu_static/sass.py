"""The loops of a compiled kernel's machine code (SASS) and a nominal cycle count for each.

The cubin is disassembled with the ``nvdisasm`` shipped in Triton's package and cut into basic
blocks. A loop is a *natural loop*: a branch back to a block that dominates it (every path from
the kernel's entry to the branch passes through that block, the loop's header); its body is
every block that reaches the branch without passing through the header, out-of-line blocks
included. A backward jump from a slow path placed after the kernel's exit into the middle of
the code is not a loop: its target does not dominate it. Loops nest by their headers.

The loops of interest are the outermost ones of at least ``MIN_LOOP`` instructions (shorter
ones are spin or trap loops): in every kernel here, one iteration covers one tile of (query,
key) pairs. A loop nested inside one (T5's loop over the buckets present in a tile) is counted
**whole, as one trip per iteration** of the outer loop: every instruction of the outer loop's
body, the nested body included once. Code reached through ``CALL`` is not counted (ptxas emits
calls for slow paths on some targets, never on sm_90 here).

Each instruction of a loop body is put in the class of the unit that executes it, and the
loop's cycles per iteration per SM for one CTA (all its warps) are, per class (nominal per-SM
rates, lanes per clock):

======== =========================================================== ==========
class    instructions                                                 rate
======== =========================================================== ==========
tc       HGMMA / HMMA (FLOPs from the shape: per warpgroup on sm_90,  4096 / 2048
         per warp on sm_80)                                           FLOP/clk
fp32     FADD, FMUL, FFMA (and their immediates), FSWZADD             128
alu      integer, logic, compare, select, min/max, half2 arithmetic  64
mufu     MUFU (ex2, lg2, rcp, ...)                                    16
cvt      F2F, F2FP, I2F, F2I, FRND                                    16
shfl     SHFL                                                         32
issue    every instruction, one warp-instruction per clock per       4 per SM
         scheduler
spill    local-memory bytes (LDL / STL: register spills) at the L1's  128 B/clk
         bandwidth, every access an L1 hit (the cheapest case)
======== =========================================================== ==========

Memory and control instructions count for issue only (and LDL/STL for spill too). Two bounds
per iteration, both charging spill traffic on top (it competes with the tiles' own
shared-memory traffic, which the model does not count, for the same L1 data path):

* ``overlap``: the busiest of tc, fp32, alu, mufu, cvt, shfl and issue, plus spill (tensor
  cores and everything else run at the same time, perfectly);
* ``no_overlap``: tc, plus the busiest of the others, plus spill (the tensor cores and the
  rest take turns; the other units still overlap each other).

A real kernel lies between them, and memory latency and stalls, which neither counts, come on
top. The numbers are for comparing kernels compiled the same way, never a time. The classes
and rates are those the recorded anchors of :mod:`.model` were measured with; changing them
invalidates the anchors.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Instr",
    "L1_BYTES_PER_CLOCK",
    "classify",
    "disassemble",
    "inner_loops",
    "local_bytes",
    "loop_cycles",
    "parse_listing",
]

RATES = {"fp32": 128, "alu": 64, "mufu": 16, "cvt": 16, "shfl": 32}
TC_FLOP_PER_CLOCK = {90: 4096, 80: 2048}
ISSUE_PER_CLOCK = 4
L1_BYTES_PER_CLOCK = 128  # per SM, H100 and A100
MIN_LOOP = 32

_FP32 = frozenset("FADD FMUL FFMA FADD32I FMUL32I FFMA32I FSWZADD".split())
_CVT = frozenset("F2F F2FP I2F F2I I2FP F2IP FRND".split())
_MEMORY = frozenset(
    "LDG STG LDS STS LDSM STSM LDGSTS LDGDEPBAR LDL STL LD ST UTMALDG UTMASTG UBLKCP ATOM ATOMS "
    "RED ATOMG LDC ULDC SYNCS UTMAPF UTMACCTL CCTL".split()
)
_CONTROL = frozenset(
    "S2R S2UR CS2R R2UR NOP BAR BRA WARPSYNC DEPBAR WARPGROUP EXIT BSSY BSYNC YIELD VOTE VOTEU "
    "RET CALL ELECT FENCE MEMBAR ERRBAR CGAERRBAR ACQBULK ENDCOLLECTIVE NANOSLEEP "
    "WARPGROUPSET".split()
)
_ALU = frozenset(
    "FMNMX FSEL FSETP FSET IMAD IADD3 LOP3 ISETP SHF LEA SEL IMNMX PRMT IABS MOV SGXT BMSK FLO "
    "POPC IMUL VIMNMX PLOP3 P2R R2P IADD LOP ISCADD CSET CSETP VABSDIFF I2IP HADD2 HMUL2 HFMA2 "
    "HSET2 HSETP2 HMNMX2 FCHK IDP BREV".split()
)
_TENSOR = frozenset("HGMMA HMMA WGMMA IMMA QGMMA BGMMA".split())
_LOCAL = frozenset(("LDL", "STL"))
_ENDS_BLOCK = frozenset(("BRA", "BRX", "JMP", "JMX", "EXIT", "RET", "KILL"))


@dataclass(frozen=True)
class Instr:
    """One SASS instruction: the label in front of it ('' if none), its guard predicate
    ('' if unconditional, e.g. ``@!P0``), opcode with modifiers, and operands."""

    label: str
    predicate: str
    opcode: str
    operands: str

    @property
    def base(self) -> str:
        return self.opcode.split(".")[0]

    @property
    def conditional(self) -> bool:
        return self.predicate not in ("", "@PT")


def classify(opcode: str) -> str:
    """The class of an opcode: tc, mufu, fp32, cvt, shfl, mem, ctrl, alu or other."""
    base = opcode.split(".")[0]
    if base in _TENSOR:
        return "tc"
    if base == "MUFU":
        return "mufu"
    if base in _FP32:
        return "fp32"
    if base in _CVT:
        return "cvt"
    if base == "SHFL":
        return "shfl"
    if base in _MEMORY:
        return "mem"
    if base.startswith("U") or base in _CONTROL:
        return "ctrl"
    if base in _ALU or base[0] in "IF" or base.startswith("LOP"):
        return "alu"
    return "other"


def local_bytes(opcode: str) -> int:
    """Bytes one warp moves to or from local memory (the spill area) with this instruction:
    32 lanes times the access width (``LDL`` 4 bytes, ``.64`` 8, ``.128`` 16; sub-word accesses
    still move a 32-bit word per lane), 0 for any other instruction."""
    parts = opcode.split(".")
    if parts[0] not in _LOCAL:
        return 0
    width = 4
    for p in parts[1:]:
        if p in ("64", "128"):
            width = int(p) // 8
    return 32 * width


_LINE = re.compile(r"/\*([0-9a-f]+)\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)(.*?);")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_TARGET = re.compile(r"`\((\.L_x_\d+)\)")


def parse_listing(text: str) -> list[Instr]:
    """The instructions of an ``nvdisasm -c`` listing, in address order."""
    out, label = [], ""
    for line in text.splitlines():
        m = _LABEL.match(line)
        if m:
            label = m.group(1)
            continue
        m = _LINE.search(line)
        if m:
            out.append(Instr(label, (m.group(2) or "").strip(), m.group(3), m.group(4)))
            label = ""
    return out


def disassemble(cubin: bytes) -> list[Instr]:
    """The instructions of a cubin, in address order."""
    from triton import knobs

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        text = subprocess.run(
            [knobs.nvidia.nvdisasm.path, "-c", str(path)], capture_output=True, text=True,
            check=True,
        ).stdout  # fmt: skip
    return parse_listing(text)


def _tc_flop(opcode: str) -> int:
    m = re.match(r"(?:HGMMA|WGMMA)\.(\d+)x(\d+)x(\d+)", opcode)
    if m:  # per warpgroup
        return 2 * int(m.group(1)) * int(m.group(2)) * int(m.group(3))
    m = re.match(r"HMMA\.168(\d+)", opcode)
    if m:  # m16 n8 k<x>, per warp
        return 2 * 16 * 8 * int(m.group(1))
    return 0


# ---------------------------------------------------------------------------------------------
# Control flow: basic blocks, dominators, natural loops
# ---------------------------------------------------------------------------------------------


def _blocks(instrs: list[Instr]) -> tuple[list[tuple[int, int]], list[list[int]]]:
    """Basic blocks ``[(first, last)]`` in address order and the successors of each."""
    where = {ins.label: i for i, ins in enumerate(instrs) if ins.label}
    leaders = {0} if instrs else set()
    for i, ins in enumerate(instrs):
        if ins.label:
            leaders.add(i)
        if ins.base in _ENDS_BLOCK and i + 1 < len(instrs):
            leaders.add(i + 1)
    starts = sorted(leaders)
    spans = [(a, (starts[k + 1] - 1 if k + 1 < len(starts) else len(instrs) - 1))
             for k, a in enumerate(starts)]  # fmt: skip
    block_of = {a: k for k, (a, _) in enumerate(spans)}
    succ: list[list[int]] = []
    for k, (_, last) in enumerate(spans):
        ins = instrs[last]
        out = []
        falls = k + 1 < len(spans)
        if ins.base in ("BRA", "JMP"):
            m = _TARGET.search(ins.operands)
            if m and m.group(1) in where:
                out.append(block_of[where[m.group(1)]])
            falls = falls and (ins.conditional or not m)
        elif ins.base in ("EXIT", "RET", "KILL", "BRX", "JMX"):
            falls = falls and ins.conditional  # an indirect branch's targets are not followed
        if falls:
            out.append(k + 1)
        succ.append(list(dict.fromkeys(out)))
    return spans, succ


def _dominators(succ: list[list[int]]) -> list[int | None]:
    """Immediate dominator of each block (entry: itself; unreachable: None); the iterative
    algorithm of Cooper, Harvey and Kennedy over a reverse post-order."""
    n = len(succ)
    order, seen = [], [False] * n
    stack = [(0, iter(succ[0]))] if n else []
    if n:
        seen[0] = True
    while stack:  # iterative depth-first post-order
        node, it = stack[-1]
        nxt = next(it, None)
        if nxt is None:
            order.append(node)
            stack.pop()
        elif not seen[nxt]:
            seen[nxt] = True
            stack.append((nxt, iter(succ[nxt])))
    rpo = order[::-1]
    index = {b: i for i, b in enumerate(rpo)}
    preds: list[list[int]] = [[] for _ in range(n)]
    for b in rpo:
        for s in succ[b]:
            preds[s].append(b)
    idom: list[int | None] = [None] * n
    if n:
        idom[0] = 0

    def meet(a: int, b: int) -> int:
        while a != b:
            while index[a] > index[b]:
                a = idom[a]
            while index[b] > index[a]:
                b = idom[b]
        return a

    changed = True
    while changed:
        changed = False
        for b in rpo[1:]:
            done = [p for p in preds[b] if idom[p] is not None]
            new = done[0]
            for p in done[1:]:
                new = meet(p, new)
            if idom[b] != new:
                idom[b] = new
                changed = True
    return idom


def _dominates(idom: list[int | None], a: int, b: int) -> bool:
    while True:
        if a == b:
            return True
        if idom[b] is None or idom[b] == b:
            return False
        b = idom[b]


def natural_loops(instrs: list[Instr]) -> list[dict]:
    """Every natural loop: ``header`` (its first instruction's index), ``blocks`` (a set of
    basic-block numbers), ``indices`` (its instructions' indices, sorted) and ``parent`` (the
    index in the returned list of the smallest loop containing it, or None), by header
    address."""
    spans, succ = _blocks(instrs)
    idom = _dominators(succ)
    preds: list[list[int]] = [[] for _ in spans]
    for b, ss in enumerate(succ):
        for s in ss:
            preds[s].append(b)
    bodies: dict[int, set[int]] = {}
    for u, ss in enumerate(succ):
        if idom[u] is None:
            continue
        for h in ss:
            if _dominates(idom, h, u):  # a back edge u -> h
                body = bodies.setdefault(h, {h})
                work = [u]
                while work:
                    x = work.pop()
                    if x not in body:
                        body.add(x)
                        work.extend(p for p in preds[x] if idom[p] is not None)
    headers = sorted(bodies, key=lambda h: spans[h][0])
    loops = []
    for h in headers:
        idx = sorted(i for b in bodies[h] for i in range(spans[b][0], spans[b][1] + 1))
        loops.append(dict(header=spans[h][0], blocks=bodies[h], indices=idx, parent=None))
    for i, lp in enumerate(loops):
        around = [j for j, other in enumerate(loops)
                  if j != i and lp["blocks"] < other["blocks"]]  # fmt: skip
        if around:
            lp["parent"] = min(around, key=lambda j: len(loops[j]["blocks"]))
    return loops


def inner_loops(instrs: list[Instr]) -> list[dict]:
    """The loops over tiles: the outermost natural loops of at least ``MIN_LOOP``
    instructions, in program order, each counted whole (nested loops at one trip).

    Each: ``start`` (header index), ``total`` (instructions), ``counts`` per class,
    ``tc_flop``, ``local`` (local-memory instructions: spill loads and stores), ``local_bytes``
    (per warp), ``barriers`` (block-wide ``BAR.SYNC`` / ``BAR.RED``) and ``nested`` (the sizes
    of the loops directly inside it, counted at one trip).
    """
    loops = natural_loops(instrs)
    out = []
    for i, lp in enumerate(loops):
        if lp["parent"] is not None or len(lp["indices"]) < MIN_LOOP:
            continue
        counts: dict[str, int] = {}
        flop = local = moved = barriers = 0
        for k in lp["indices"]:
            ins = instrs[k]
            c = classify(ins.opcode)
            counts[c] = counts.get(c, 0) + 1
            flop += _tc_flop(ins.opcode)
            if ins.base in _LOCAL:
                local += 1
                moved += local_bytes(ins.opcode)
            if ins.opcode.startswith(("BAR.SYNC", "BAR.RED")):
                barriers += 1
        nested = [len(o["indices"]) for o in loops if o["parent"] == i]
        out.append(dict(start=lp["header"], total=len(lp["indices"]), counts=counts,
                        tc_flop=flop, local=local, local_bytes=moved, barriers=barriers,
                        nested=nested))  # fmt: skip
    return out


def loop_cycles(loop: dict, arch: int, warps: int) -> dict:
    """Cycles per iteration per SM for one CTA: per class (``cycles``), the busiest class
    (``bound``), and the two bounds ``overlap`` and ``no_overlap`` (module docstring); ``max``
    is ``overlap``."""
    c = loop["counts"]
    cyc = {k: c.get(k, 0) * warps * 32 / rate for k, rate in RATES.items()}
    groups = warps / 4 if arch >= 90 else warps
    cyc["tc"] = loop["tc_flop"] * groups / TC_FLOP_PER_CLOCK[arch]
    cyc["issue"] = loop["total"] * warps / ISSUE_PER_CLOCK
    spill = loop.get("local_bytes", 0) * warps / L1_BYTES_PER_CLOCK
    bound = max(cyc, key=cyc.get)
    rest = max(v for k, v in cyc.items() if k != "tc")
    cyc["spill"] = spill
    overlap = cyc[bound] + spill
    if spill:
        bound += "+spill"
    return dict(cycles=cyc, bound=bound, max=overlap, overlap=overlap,
                no_overlap=cyc["tc"] + rest + spill)  # fmt: skip
