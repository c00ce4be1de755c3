"""The one opcode enum of the dataflow graph (docs/architecture.md#dfg)."""

from __future__ import annotations

from enum import Enum


class Op(str, Enum):
    """Node kinds of a kernel's loop-body DFG. Values are the names used in arch YAML."""

    CONST = "const"
    LOAD = "load"  # affine stream load from an SPM buffer
    GATHER = "gather"  # indirect load: address uses a loaded index (PIT's SRead)
    STORE = "store"  # affine stream store
    SCATTER = "scatter"  # indirect store (PIT's SWrite)
    ACC = "acc"  # accumulate into an SPM buffer: read-modify-write
    MUL = "mul"
    ADD = "add"
    SUB = "sub"
    # a*b + c (c - a*b when the node's value is negative), a rounded mul then a rounded add
    MAC = "mac"
    MAX = "max"
    EXP = "exp"
    BFLY = "bfly"  # butterfly 2x2
    ROUTE = "route"  # pass-through on a PE (routing / shuffle)
    # max-accumulate into an SPM buffer (a row max of softmax): read-modify-write
    ACC_MAX = "accmax"
    DIV = "div"  # a / b, rounded once (softmax normalisation; on the special-function unit)
    VSUM = "vsum"  # sum of a SIMD vector's lanes -> a scalar (a lane-reduction adder tree)
    # indirect accumulate (PIT's SWrite with accumulate): buffer[index * stride + affine] += value;
    # combines in the PE's register like ACC, one SPM read-modify-write per run of same-address
    # iterations; lanes of one vector that hit the same word are serialised (see fast.py)
    SCATTER_ACC = "scatter_acc"
    # fused multiply-accumulate into an SPM buffer: a*b combines into the PE's accumulator
    # register like ACC (one read-modify-write per run of same-address iterations); the
    # multiplier is pipelined and the accumulate stage takes one cycle (docs/conventions.md#macc)
    MACC = "macc"

    @property
    def is_memory(self) -> bool:
        return self in MEMORY_OPS

    @property
    def reads_spm(self) -> bool:
        return self in (Op.LOAD, Op.GATHER, Op.ACC, Op.ACC_MAX, Op.SCATTER_ACC, Op.MACC)

    @property
    def writes_spm(self) -> bool:
        return self in (Op.STORE, Op.SCATTER, Op.ACC, Op.ACC_MAX, Op.SCATTER_ACC, Op.MACC)

    @property
    def accumulates(self) -> bool:
        """Combines into its PE's register and flushes one SPM read-modify-write per run of
        same-address iterations (ACC, SCATTER_ACC and MACC add -- MACC its inputs' product --,
        ACC_MAX takes the maximum)."""
        return self in (Op.ACC, Op.ACC_MAX, Op.SCATTER_ACC, Op.MACC)

    @property
    def is_indirect(self) -> bool:
        """Its address adds a loaded index times `index_stride` (gather, scatter, scatter_acc)."""
        return self in (Op.GATHER, Op.SCATTER, Op.SCATTER_ACC)

    @property
    def inherits_lanes(self) -> bool:
        """Its value is a SIMD vector when any input is one. Loads and gathers take their width
        from their own address instead; a lane sum (vsum) makes a scalar of a vector."""
        return self not in (Op.LOAD, Op.GATHER, Op.VSUM)

    @property
    def is_mac(self) -> bool:
        return self is Op.MAC

    @property
    def multiplies(self) -> bool:
        """Counts as a multiply-accumulate (the engines' MAC count, the energy table's mac_pj)."""
        return self in (Op.MUL, Op.MAC, Op.MACC)

    @property
    def selects_lane(self) -> bool:
        """May take input 0 as one lane of a vector (`Node.lane`): a mul or macc broadcasts it
        over the other input's lanes; a gather takes it as its index
        (docs/conventions.md#nonzero-unroll)."""
        return self in (Op.MUL, Op.MACC, Op.GATHER)


MEMORY_OPS = frozenset({Op.LOAD, Op.GATHER, Op.STORE, Op.SCATTER, Op.ACC, Op.ACC_MAX,
                        Op.SCATTER_ACC, Op.MACC})
ARITY = {
    Op.CONST: 0, Op.LOAD: 0, Op.GATHER: 1, Op.STORE: 1, Op.SCATTER: 2, Op.ACC: 1,
    Op.MUL: 2, Op.ADD: 2, Op.SUB: 2, Op.MAC: 3, Op.MAX: 2, Op.EXP: 1, Op.BFLY: 2, Op.ROUTE: 1,
    Op.ACC_MAX: 1, Op.DIV: 2, Op.VSUM: 1, Op.SCATTER_ACC: 2, Op.MACC: 2,
}
