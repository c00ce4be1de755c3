"""DFG: `Program` = DAG of `Kernel`s; `Kernel` = loop-body DFG + iteration domain + streams."""

from dataflow.dfg.graph import Addr, Buffer, DFGError, Kernel, Loop, Node, Program
from dataflow.dfg.ops import Op

__all__ = ["Addr", "Buffer", "DFGError", "Kernel", "Loop", "Node", "Op", "Program"]
