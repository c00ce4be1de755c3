"""GPU specs, the roofline model, `dataflow crosscheck` and `dataflow compare`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dataflow.cli import main as cli_main
from dataflow.cuda.compare import compare_model, layer_work
from dataflow.cuda.gpu_spec import GpuSpecError, available_gpus, gpu_from_dict, load_gpu
from dataflow.cuda.roofline import launch_seconds, measured_cost, model_cost
from dataflow.cuda.runner import KernelLaunch, OpTiming
from dataflow.models import simulate as simulate_model

GOOD = {"name": "toy", "peak_flops": {"fp32": 1.0e12}, "memory_bandwidth_bytes_per_s": 1.0e11,
        "power_w": 10.0, "kernel_launch_s": 1.0e-6}


def test_shipped_gpus_load_with_their_datasheet_numbers():
    assert {"jetson_xavier_nx", "a100", "h200"} <= set(available_gpus())
    nx = load_gpu("jetson_xavier_nx")
    # 384 CUDA cores x 2 FLOP x 1.1 GHz; 128-bit LPDDR4x at 1600 MHz, double data rate
    assert nx.peak("fp32") == pytest.approx(384 * 2 * 1.1e9)
    assert nx.memory_bandwidth_bytes_per_s == pytest.approx(128 / 8 * 1600e6 * 2)
    assert nx.power_w == 15.0
    a100, h200 = load_gpu("a100"), load_gpu("h200")
    assert (a100.peak("fp32"), a100.memory_bandwidth_bytes_per_s, a100.power_w) == \
        (19.5e12, 2039e9, 400.0)
    assert (h200.peak("fp32"), h200.memory_bandwidth_bytes_per_s, h200.power_w) == \
        (67e12, 4.8e12, 700.0)
    assert h200.peak("fp16_tensor") == pytest.approx(1979e12 / 2)  # dense = half the sparse
    assert h200.matches_device("NVIDIA H200") and not a100.matches_device("NVIDIA H200")


@pytest.mark.parametrize("change, path, words", [
    ({"colour": "green"}, "colour", "unknown key"),
    ({"power_w": None}, "power_w", "expected a number"),
    ({"power_w": "1e12"}, "power_w", "e+12"),
    ({"power_w": -5}, "power_w", "positive"),
    ({"peak_flops": {"fp32": 1e12, "fp33": 1e12}}, "peak_flops.fp33", "unknown precision"),
    ({"peak_flops": {"fp16": 1e12}}, "peak_flops.fp32", "required"),
    ({"peak_flops": {"fp32": 0}}, "peak_flops.fp32", "positive"),
    ({"name": ""}, "name", "non-empty"),
])
def test_bad_gpu_spec_names_file_and_key(change, path, words):
    data = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    if change.get("power_w", 0) is None:
        data.pop("power_w", None)
        words = "required"
    with pytest.raises(GpuSpecError) as err:
        gpu_from_dict(data, source="gpus/toy.yaml")
    assert err.value.key_path == path and str(err.value).startswith("gpus/toy.yaml: ")
    assert words in str(err.value)


def test_gpu_files_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="known GPUs: .*h200"):
        load_gpu("no_such_gpu")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(GpuSpecError, match="not valid YAML"):
        load_gpu(bad)
    with pytest.raises(GpuSpecError, match=r"peak_flops.bf16_tensor: no peak given"):
        load_gpu("jetson_xavier_nx").peak("bf16_tensor")


def test_roofline_closed_forms():
    spec = gpu_from_dict(GOOD)
    compute = KernelLaunch("k", (1,), (1,), flops=2_000_000, bytes=1000)  # 2 us vs 10 ns
    memory = KernelLaunch("m", (1,), (1,), flops=10, bytes=1_000_000)  # 10 us of DRAM
    c = model_cost(spec, [compute])
    assert c.seconds == pytest.approx(2e-6 + 1e-6) and c.bound == "compute"
    assert c.energy_joules == pytest.approx(10.0 * c.seconds)
    assert (c.time_source, c.energy_source) == ("modelled", "modelled")
    both = model_cost(spec, [compute, memory])
    assert both.seconds == pytest.approx(3e-6 + 11e-6) and both.bound == "mixed"
    assert both.flops == 2_000_010 and both.launches == 2
    with pytest.raises(ValueError, match="at least one"):
        model_cost(spec, [])


def test_measured_cost_only_from_a_gpu_measurement_on_that_gpu():
    spec = load_gpu("h200")
    sim = OpTiming("gemm", "cudasim", "CUDA simulator", 10, 10, 0, None)
    with pytest.raises(ValueError, match="not measured on a GPU"):
        measured_cost(spec, sim)
    other = OpTiming("gemm", "gpu", "NVIDIA A100-SXM4-80GB (sm_80)", 10, 10, 3, 1e-3)
    with pytest.raises(ValueError, match="not on h200"):
        measured_cost(spec, other)
    here = OpTiming("gemm", "gpu", "NVIDIA H200 (sm_90)", 10, 10, 3, 1e-3)
    c = measured_cost(spec, here)
    assert (c.time_source, c.energy_source, c.seconds) == ("measured", "modelled", 1e-3)
    assert c.energy_joules == pytest.approx(0.7)


def test_compare_gemm_matches_simulate_and_the_closed_form():
    """Dataflow side = `dataflow.simulate` on the same seed; GPU side = the roofline of the
    tiled GEMM's 2mnk FLOPs and compulsory bytes (no GPU here: modelled, and labelled)."""
    import dataflow
    from dataflow.cuda.compare import compare
    from dataflow.cuda.device import have_gpu

    m, k, n = 32, 32, 16
    r = compare("gemm", gpus=["jetson_xavier_nx", "h200"], measure_if_present=False,
                m=m, k=k, n=n)
    sim = dataflow.simulate("gemm", m=m, k=k, n=n)
    assert r.dataflow_cycles == sim.cycles
    assert r.dataflow_energy_joules == pytest.approx(sim.energy_total_pj * 1e-12)
    for g, name in zip(r.gpus, ("jetson_xavier_nx", "h200")):
        spec = load_gpu(name)
        expect = max(2 * m * n * k / spec.peak(), 4 * (m * k + k * n + m * n)
                     / spec.memory_bandwidth_bytes_per_s) + spec.kernel_launch_s
        assert g.seconds == pytest.approx(expect)
        assert g.time_source == "modelled" and "modelled" in r.summary()
        assert r.speedup(g) == pytest.approx(expect / sim.time_seconds)
    if not have_gpu():
        assert not any("measured" in g.time_source for g in r.gpus)


def test_cli_compare_json_and_plot(tmp_path, capsys):
    from dataflow.cli import main

    plot = tmp_path / "cmp.png"
    rc = main(["compare", "--workload", "attention", "--pattern", "window", "--window", "2",
               "--seq", "16", "--dim", "8", "--gpu", "jetson_xavier_nx", "--gpu", "a100",
               "--model-only", "--json", "--plot", str(plot)])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and plot.stat().st_size > 0 and out["plot"] == str(plot)
    assert out["dataflow"]["source"] == "simulated"
    assert [g["gpu"] for g in out["gpus"]] == ["jetson-xavier-nx", "a100-sxm4-80gb"]
    assert all(g["time_source"] == "modelled" for g in out["gpus"])
    # the A100 has more bandwidth and FLOP/s: modelled faster than the Jetson on the same launches
    assert out["gpus"][1]["seconds"] < out["gpus"][0]["seconds"]


def test_cli_crosscheck_reports_three_pairs(capsys):
    from dataflow.cli import main
    from dataflow.cuda.device import execution_mode

    rc = main(["crosscheck", "--workload", "spmm", "--m", "16", "--k", "16", "--n", "8",
               "--density", "0.2"])
    text = capsys.readouterr().out
    assert rc == 0
    for pair in ("numpy vs sim", "numpy vs cuda", "sim vs cuda"):
        assert pair in text
    if execution_mode() == "cudasim":
        assert "CUDA simulator" in text and "no GPU" in text


def test_crosscheck_dynamic_spmm_values():
    from dataflow.cuda.compare import crosscheck

    r = crosscheck("dynamic-spmm", m=64, k=64, n=32, sparsity=0.5, granularity="1x64")
    assert r.ok and len(r.pairs) == 3
    assert all(p.max_abs_error < 1e-4 for p in r.pairs)
    d = r.to_dict()
    assert d["ok"] and d["cuda_mode"] in ("gpu", "cudasim")


def test_cli_errors_are_one_line(capsys):
    from dataflow.cli import main

    rc = main(["compare", "--workload", "gemm", "--m", "8", "--k", "8", "--n", "8",
               "--gpu", "no_such_gpu", "--no-plot"])
    err = capsys.readouterr().err
    assert rc == 2 and "unknown GPU 'no_such_gpu'" in err and err.count("\n") == 1
    rc = main(["crosscheck", "--workload", "gemm", "--m", "8", "--k", "8", "--n", "8",
               "--window", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and "does not take --window" in err



def test_gpu_report_refuses_without_a_gpu(tmp_path, capsys):
    """scripts/gpu_report.py is for GPU machines: without one it stops at once (rc 2) unless
    asked for a simulator smoke run, and writes no report claiming GPU results."""
    import importlib.util

    from dataflow.cuda.device import have_gpu
    from tests.conftest import ROOT

    if have_gpu():
        pytest.skip("this machine has a GPU: the script would run in full")
    spec = importlib.util.spec_from_file_location("gpu_report", ROOT / "scripts" / "gpu_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "r.md"
    assert mod.main(["--out", str(out)]) == 2
    assert "no CUDA device" in capsys.readouterr().err and not out.exists()


# --- compare --model: per layer, GPU modelled and labelled --------------------------------------

def test_compare_model_per_layer_modelled_and_labelled(capsys):
    bert = Path(__file__).resolve().parent.parent / "models" / "bert_base_layer.yaml"
    sizes = {"seq": 8, "hidden": 16, "heads": 2, "ffn": 32}
    r = simulate_model(bert, **sizes)
    c = compare_model(bert, gpus=["a100"], measure_if_present=False, result=r)
    spec = load_gpu("a100")
    assert [x.name for x in c.layers] == [lr.layer.name for lr in r.layers]
    for x, lr in zip(c.layers, r.layers):
        assert x.dataflow_cycles == lr.result.cycles
        (g,) = x.gpus
        assert g.time_source == "modelled" and g.launches == 1
        assert g.seconds == pytest.approx(launch_seconds(spec, KernelLaunch(x.name, (1,), (1,),
                                                                       x.flops, x.bytes)))
        if lr.layer.kind == "gemm":  # 2 FLOPs per MAC the array counted, fp32 operands once
            m, k, n = (lr.layer.size(s) for s in "mkn")
            assert x.flops == 2 * lr.result.macs == 2 * m * k * n
            assert x.bytes == 4 * (m * k + k * n + m * n)
    attn = r.layer("attn").layer
    assert layer_work(attn)[0] == 2 * 8 * 8 * (4 * 8 + 3)  # heads x dense scores x (4d + 3)
    assert c.gpu_seconds(0) == pytest.approx(sum(x.gpus[0].seconds for x in c.layers))
    rc = cli_main(["compare", "--model", str(bert), "--seq", "8", "--size", "hidden=16",
                   "--size", "heads=2", "--size", "ffn=32", "--gpu", "a100", "--model-only"])
    out = capsys.readouterr().out
    assert rc == 0 and "per layer" in out and "modelled" in out and "ffn2" in out
    assert "measured" not in out.split("note:")[0]
    rc = cli_main(["compare", "--model", str(bert), "--seq", "8", "--size", "hidden=16",
                   "--size", "heads=2", "--size", "ffn=32", "--model-only", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and all(g["time_source"] == "modelled" for la in d["layers"]
                           for g in la["gpus"])
    assert cli_main(["compare", "--model", str(bert), "--size", "sq=2"]) == 2
    assert "has no size 'sq'" in capsys.readouterr().err
