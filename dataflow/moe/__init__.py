"""Mixture of experts on the array: top-k gating, token dispatch, expert GEMMs, combine, with
the load imbalance across experts visible in the simulated timeline (`draw_timeline`).

The `moe` workload registers itself when this package is imported.
"""

from dataflow.moe.api import register_workloads, simulate_moe
from dataflow.moe.gating import Routing, make_moe_operands, moe_reference, route
from dataflow.moe.timeline import draw_timeline

register_workloads()

__all__ = ["Routing", "draw_timeline", "make_moe_operands", "moe_reference", "route",
           "simulate_moe"]
