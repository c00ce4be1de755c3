"""Traces and pictures of a simulation or a whole model (`dataflow report RESULT --out DIR`)."""

from dataflow.report.plots import (
           gantt,
           layer_cycles,
           layer_roofline,
           layer_share,
           pe_heatmap,
           roofline,
           spm_heatmap,
           write_report,
)
from dataflow.report.result_file import (
           MODEL_FORMAT,
           load_result,
           model_result_data,
           read_trace,
           result_data,
           save_result,
           write_trace,
)

__all__ = ["MODEL_FORMAT", "gantt", "layer_cycles", "layer_roofline", "layer_share",
           "load_result", "model_result_data", "pe_heatmap", "read_trace", "result_data",
           "roofline", "save_result", "spm_heatmap", "write_report", "write_trace"]
