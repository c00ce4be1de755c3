"""Traces and pictures of a simulation (`dataflow report RESULT --out DIR`)."""

from dataflow.report.plots import gantt, pe_heatmap, roofline, spm_heatmap, write_report
from dataflow.report.result_file import (
           load_result,
           read_trace,
           result_data,
           save_result,
           write_trace,
)

__all__ = ["gantt", "load_result", "pe_heatmap", "read_trace", "result_data", "roofline",
           "save_result", "spm_heatmap", "write_report", "write_trace"]
