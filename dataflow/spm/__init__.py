"""The multi-line scratchpad: address-to-line policy and port arithmetic."""

from dataflow.spm.lines import line_of_row, port_cycles

__all__ = ["line_of_row", "port_cycles"]
