"""Bad architecture files and bad simulate parameters (issue 15, section 4): each is one short
`UserError` naming the file, key path, parameter or flag, raised up front and quickly."""

import time

import pytest
import yaml

from dataflow import api, workloads
from dataflow.arch import ArchError, load_arch
from dataflow.arch.limits import MAX_RECONFIGURABLE_SIDE, MAX_SYSTOLIC_SIDE, MAX_YAML_NODES
from dataflow.cli import main
from dataflow.errors import UserError
from dataflow.moe.gating import make_moe_operands
from tests.archs import default_dict

SHORT = 500  # characters: an error message is one readable line


def _write(tmp_path, data, name="bad.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return p


def _arch_error(path, key_path="") -> ArchError:
    with pytest.raises(ArchError) as e:
        load_arch(path)
    msg = str(e.value)
    assert str(path) in msg and len(msg) < SHORT, msg
    assert e.value.key_path == key_path, msg
    return e.value


# --- sizes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["rows", "cols"])
def test_a_huge_array_is_refused_up_front_naming_the_limit(tmp_path, key):
    d = default_dict()
    d["pe_array"][key] = 100000
    p = _write(tmp_path, d)
    t0 = time.perf_counter()
    with pytest.raises(ArchError) as e:
        api.simulate("gemm", p, m=8, k=8, n=8)
    assert time.perf_counter() - t0 < 5
    assert e.value.key_path == f"pe_array.{key}"
    assert str(MAX_RECONFIGURABLE_SIDE) in str(e.value) and str(p) in str(e.value)


def test_a_systolic_array_has_its_own_larger_limit(tmp_path):
    d = yaml.safe_load(open(api.preset_path("systolic_32x32")))
    d["pe_array"]["rows"] = MAX_SYSTOLIC_SIDE
    load_arch(_write(tmp_path, d, "ok.yaml"))
    d["pe_array"]["rows"] = MAX_SYSTOLIC_SIDE + 1
    assert str(MAX_SYSTOLIC_SIDE) in str(_arch_error(_write(tmp_path, d), "pe_array.rows"))


def test_gemm_too_large_for_host_memory_is_one_clear_error(monkeypatch):
    # the command: 10M x 64 operands died in numpy with a MemoryError (38 GiB); they
    # now stream one M tile at a time (tests/test_any_size.py), so the error is for a host
    # that cannot hold even one tile (B and a row of A and C)
    monkeypatch.setattr(workloads, "memory_budget_bytes", lambda: 2**14)
    with pytest.raises(UserError, match=r"gemm streamed tile \(--m [0-9]+ of 10000000 --k 64 "
                                        r"--n 64\) and its simulation need [0-9.e-]+ GiB of "
                                        r"host memory; the limit is 1.53e-05 GiB"):
        api.simulate("gemm", m=10_000_000, k=64, n=64)


@pytest.mark.parametrize("workload, params", [
    ("gemm", {"m": 10**12, "k": 64, "n": 64}),
    ("spmm", {"m": 10**12, "k": 64, "n": 64, "density": 0.5}),
    ("attention", {"seq": 2**40, "dim": 64}),
    ("dynamic-spmm", {"m": 2**40, "k": 64, "n": 64, "granularity": "32x1"}),
    ("dynamic-spmm", {"m": 64, "k": 64, "n": 2**40, "granularity": "32x1"}),
    ("relu-ffn", {"tokens": 2**30, "dim": 64, "hidden": 2**20}),
    ("moe", {"tokens": 2**40}),
    ("butterfly", {"n": 2**40}),
    ("fft", {"batch": 2**40}),
    ("fnet-attention", {"seq": 2**40}),
])
def test_every_workload_checks_host_memory_before_allocating(workload, params):
    t0 = time.perf_counter()
    # a matmul streamed tile by tile holds little, but would compute for days
    # (docs/conventions.md#tiling-any-problem-size)
    with pytest.raises(UserError, match="of host (memory|arithmetic)[^;]*; the limit is") as e:
        api.simulate(workload, **params)
    assert time.perf_counter() - t0 < 5 and len(str(e.value)) < SHORT


# --- files that are not YAML text ----------------------------------------------------------

def test_an_undecodable_file_names_the_file(tmp_path):
    p = tmp_path / "binary.yaml"
    p.write_bytes(b"name: \xba\xff\x00\x01 binary")
    err = _arch_error(p)
    assert "not UTF-8" in str(err) and "0xba" in str(err)
    assert isinstance(err, UserError)


def test_an_alias_bomb_is_refused_quickly_and_briefly(tmp_path):
    lines = ['a0: &a0 ["xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    p = _write(tmp_path, "\n".join(lines) + "\nname: *a9\n")
    t0 = time.perf_counter()
    err = _arch_error(p, "a5")  # the first anchor whose expansion passes the bound
    assert time.perf_counter() - t0 < 5
    assert f"{MAX_YAML_NODES:,}" in str(err)


def test_a_small_alias_is_fine(tmp_path):
    d = default_dict()
    text = yaml.safe_dump(d).replace("spm:", "spm: &spm", 1)
    load_arch(_write(tmp_path, text))


def test_a_long_value_is_echoed_cut_short(tmp_path):
    d = default_dict()
    d["name"] = ["x" * 10_000] * 1000
    err = _arch_error(_write(tmp_path, d), "name")
    assert "expected a string" in str(err)


def test_a_long_unknown_key_is_echoed_cut_short(tmp_path):
    d = default_dict()
    d["k" * 10_000] = 1
    assert "unknown key" in str(_arch_error(_write(tmp_path, d), "k" * 80 + "..."))


# --- values YAML accepts but an architecture must not --------------------------------------

def test_a_key_given_twice_is_refused(tmp_path):
    text = yaml.safe_dump(default_dict()).replace("  rows: 8\n", "  rows: 8\n  rows: 4\n", 1)
    assert "rows: 4" in text
    err = _arch_error(_write(tmp_path, text), "pe_array.rows")
    assert "given twice" in str(err)


@pytest.mark.parametrize("key, text", [
    ("clock_ghz", ".nan"), ("clock_ghz", ".inf"), ("dram.bytes_per_cycle", ".inf"),
    ("energy.mac_pj", "-.inf"), ("energy.mac_pj", ".nan"),
])
def test_nan_and_infinity_are_refused(tmp_path, key, text):
    d = default_dict()
    *outer, last = key.split(".")
    (d[outer[0]] if outer else d)[last] = "PLACEHOLDER"
    p = _write(tmp_path, yaml.safe_dump(d).replace("PLACEHOLDER", text))
    assert "finite" in str(_arch_error(p, key))


def test_dataflow_on_a_reconfigurable_array_is_refused():
    with pytest.raises(UserError, match="--dataflow ws applies only to systolic arrays"):
        api.simulate("gemm", "default", m=8, k=8, n=8, dataflow="ws")


# --- simulate parameters -------------------------------------------------------------------

@pytest.mark.parametrize("skew", [float("nan"), float("inf")])
def test_nan_or_infinite_skew_is_refused(skew):
    with pytest.raises(UserError, match=r"--skew \(parameter 'skew'\) must be a finite number"):
        api.simulate("moe", skew=skew)
    with pytest.raises(UserError, match="--skew must be a finite number"):
        make_moe_operands(4, 8, 8, 8, skew)


def test_python_api_coerces_parameters_by_their_declared_type():
    r = api.simulate("gemm", m="16", k=16.0, n=16)
    assert r.values_match_reference
    assert r.macs == 16 ** 3


@pytest.mark.parametrize("value", [16.5, "sixteen", True, [16]])
def test_python_api_refuses_parameters_of_the_wrong_type(value):
    with pytest.raises(UserError, match=r"--m \(parameter 'm'\) must be an integer") as e:
        api.simulate("gemm", m=value)
    assert len(str(e.value)) < SHORT


@pytest.mark.parametrize("seed", [-1, 1.5, "0"])
def test_bad_seed_names_the_flag(seed):
    with pytest.raises(UserError, match="--seed must be a non-negative integer"):
        api.simulate("gemm", m=8, k=8, n=8, seed=seed)


# --- the CLI: exit code 2 and one line on stderr -------------------------------------------

def _cli_error(argv, capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and len(err) < SHORT, err
    return err


def test_cli_negative_seed(capsys):
    assert "--seed" in _cli_error(["simulate", "--workload", "gemm", "--seed", "-1"], capsys)


def test_cli_nan_skew(capsys):
    assert "--skew" in _cli_error(["simulate", "--workload", "moe", "--skew", "nan"], capsys)


def test_cli_huge_array(tmp_path, capsys):
    d = default_dict()
    d["pe_array"]["rows"] = 100000
    p = _write(tmp_path, d)
    err = _cli_error(["simulate", "--workload", "gemm", "--arch", str(p)], capsys)
    assert str(p) in err and "pe_array.rows" in err


def test_cli_binary_arch_file(tmp_path, capsys):
    p = tmp_path / "binary.yaml"
    p.write_bytes(bytes(range(256)))
    assert str(p) in _cli_error(["simulate", "--arch", str(p)], capsys)


def test_cli_gemm_beyond_host_memory(capsys):
    err = _cli_error(["simulate", "--workload", "gemm", "--m", str(10**12), "--k", "64",
                      "--n", "64"], capsys)
    assert "host arithmetic" in err  # streamed, it would fit the memory (test_any_size.py)


def test_cli_dataflow_on_reconfigurable_array(capsys):
    assert "--dataflow" in _cli_error(["simulate", "--workload", "gemm", "--dataflow", "ws"],
                                      capsys)
