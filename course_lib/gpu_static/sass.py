"""Inner loops of a compiled kernel's machine code (SASS) and a nominal cycle count for each.

The cubin is disassembled with the ``nvdisasm`` shipped in Triton's package. A loop is a
backward branch to an earlier label; the innermost loops of at least 32 instructions are kept
(shorter ones are spin or trap loops). Each instruction of a loop body is put in the class of
the unit that executes it, and the loop's cycles per iteration per SM for one CTA (all its
warps) are, per class (nominal per-SM rates, lanes per clock):

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
======== =========================================================== ==========

Memory and control instructions count for issue only. The iteration costs its busiest class
(``bound``). This assumes perfect overlap and ignores memory, latency and stalls: the numbers
are for comparing kernels compiled the same way, never a time. The classes and rates are those
the recorded anchors of :mod:`.model` were measured with; changing them invalidates the anchors.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

__all__ = ["disassemble", "inner_loops", "loop_cycles", "classify"]

RATES = {"fp32": 128, "alu": 64, "mufu": 16, "cvt": 16, "shfl": 32}
TC_FLOP_PER_CLOCK = {90: 4096, 80: 2048}
ISSUE_PER_CLOCK = 4
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


_LINE = re.compile(r"/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)(.*?);")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_TARGET = re.compile(r"`\((\.L_x_\d+)\)")


def disassemble(cubin: bytes) -> list[tuple[str, str, str]]:
    """``[(label or '', opcode, operands)]`` of a cubin, in address order."""
    from triton import knobs

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        text = subprocess.run(
            [knobs.nvidia.nvdisasm.path, "-c", str(path)], capture_output=True, text=True,
            check=True,
        ).stdout  # fmt: skip
    out, label = [], ""
    for line in text.splitlines():
        m = _LABEL.match(line)
        if m:
            label = m.group(1)
            continue
        m = _LINE.search(line)
        if m:
            out.append((label, m.group(2), m.group(3)))
            label = ""
    return out


def _tc_flop(opcode: str) -> int:
    m = re.match(r"(?:HGMMA|WGMMA)\.(\d+)x(\d+)x(\d+)", opcode)
    if m:  # per warpgroup
        return 2 * int(m.group(1)) * int(m.group(2)) * int(m.group(3))
    m = re.match(r"HMMA\.168(\d+)", opcode)
    if m:  # m16 n8 k<x>, per warp
        return 2 * 16 * 8 * int(m.group(1))
    return 0


def inner_loops(instrs: list[tuple[str, str, str]]) -> list[dict]:
    """The innermost loops (``counts`` per class, ``total``, ``tc_flop``), in program order."""
    where = {lab: i for i, (lab, _, _) in enumerate(instrs) if lab}
    spans = []
    for i, (_, op, rest) in enumerate(instrs):
        if op.startswith("BRA"):
            m = _TARGET.search(rest)
            if m and m.group(1) in where and where[m.group(1)] <= i:
                if i - where[m.group(1)] >= MIN_LOOP:
                    spans.append((where[m.group(1)], i))
    inner = [s for s in spans if not any(o != s and s[0] <= o[0] and o[1] <= s[1] for o in spans)]
    loops = []
    for a, b in sorted(inner):
        counts: dict[str, int] = {}
        flop = 0
        for _, op, _ in instrs[a : b + 1]:
            c = classify(op)
            counts[c] = counts.get(c, 0) + 1
            flop += _tc_flop(op)
        loops.append(dict(start=a, total=b - a + 1, counts=counts, tc_flop=flop))
    return loops


def loop_cycles(loop: dict, arch: int, warps: int) -> dict:
    """Cycles per iteration per SM for one CTA, per class; ``bound`` names the busiest."""
    c = loop["counts"]
    cyc = {k: c.get(k, 0) * warps * 32 / rate for k, rate in RATES.items()}
    groups = warps / 4 if arch >= 90 else warps
    cyc["tc"] = loop["tc_flop"] * groups / TC_FLOP_PER_CLOCK[arch]
    cyc["issue"] = loop["total"] * warps / ISSUE_PER_CLOCK
    bound = max(cyc, key=cyc.get)
    return dict(cycles=cyc, bound=bound, max=cyc[bound])
