"""The presets ship inside the package and are found by name; a built wheel, installed in a fresh
virtualenv, runs the default job from a directory outside the repository."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dataflow.api import simulate
from dataflow.arch import (
    ArchError,
    ArchSpec,
    arch_to_dict,
    load_arch,
    preset_names,
    preset_path,
    resolve_arch,
)
from dataflow.cli import main
from dataflow.cuda.gpu_spec import available_gpus, load_gpu
from dataflow.dse.sweep import SweepError, sweep_from_dict
from tests.conftest import ARCH_DIR, ROOT

ARCH_PRESETS = ("default", "mlx_4x4", "systolic_32x32")
GPU_PRESETS = ("a100", "h200", "jetson_xavier_nx")


# ------------------------------------------------------------------ the resolver

def test_preset_names_are_the_files_in_the_package():
    assert preset_names() == ARCH_PRESETS
    assert preset_names("gpus") == tuple(f"gpus/{g}" for g in GPU_PRESETS)
    assert available_gpus() == GPU_PRESETS
    for name in preset_names() + preset_names("gpus"):
        path = preset_path(name)
        assert path.is_file() and path.name == f"{name.split('/')[-1]}.yaml"
        assert ROOT / "dataflow" / "arch" / "presets" in path.parents


def test_repo_path_still_reaches_the_same_files():
    # arch_configs/ is a link to the package's presets: old paths load the same architecture
    assert (ROOT / "arch_configs").resolve() == preset_path("default").parent
    for name in ARCH_PRESETS:
        old = load_arch(ARCH_DIR / f"{name}.yaml")
        assert arch_to_dict(old) == arch_to_dict(resolve_arch(name))


@pytest.mark.parametrize("name", ARCH_PRESETS)
def test_resolve_by_name_with_or_without_suffix(name):
    spec = resolve_arch(name)
    assert isinstance(spec, ArchSpec)
    assert spec == load_arch(preset_path(name)) == resolve_arch(f"{name}.yaml")


def test_resolve_none_spec_and_path(tmp_path):
    default = resolve_arch(None)
    assert default == resolve_arch("default") and default.name == "default-8x8"
    assert resolve_arch(default) is default
    own = tmp_path / "mine.yaml"
    own.write_text(preset_path("mlx_4x4").read_text().replace("name: mlx-4x4", "name: mine"))
    assert resolve_arch(own).name == "mine" and resolve_arch(str(own)).name == "mine"


def test_a_file_wins_over_a_preset_of_the_same_name(tmp_path, monkeypatch):
    (tmp_path / "default").write_text(
        preset_path("default").read_text().replace("name: default-8x8", "name: local"))
    monkeypatch.chdir(tmp_path)
    assert resolve_arch("default").name == "local"


@pytest.mark.parametrize("name", ["nope", "nope.yaml", "dir/nope.yaml", "../resolve", "gpus/nope"])
def test_unknown_name_is_one_error_listing_the_presets(name):
    with pytest.raises(ArchError) as info:
        resolve_arch(name)
    msg = str(info.value)
    assert msg.startswith(f"{name}: ") and "presets: default, mlx_4x4, systolic_32x32" in msg
    with pytest.raises(ArchError, match="presets: default, mlx_4x4, systolic_32x32, gpus/a100"):
        preset_path(name)


def test_gpu_preset_is_not_an_architecture():
    with pytest.raises(ArchError, match="describes a GPU.*--gpu h200"):
        resolve_arch("gpus/h200")


@pytest.mark.parametrize("name", ["h200", "gpus/h200", "h200.yaml", "gpus/h200.yaml"])
def test_gpu_by_name(name):
    assert load_gpu(name) == load_gpu(ARCH_DIR / "gpus" / "h200.yaml")
    assert load_gpu(name).source == str(preset_path("gpus/h200"))


# ------------------------------------------------------------------ the CLI and the sweeps

@pytest.mark.parametrize("name", ["default", "mlx_4x4", "systolic_32x32.yaml"])
def test_cli_arch_by_name(capsys, name):
    assert main(["simulate", "--arch", name, "--workload", "gemm", "--m", "16", "--k", "16",
                 "--n", "16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["arch"] == resolve_arch(name).name and out["values_match_reference"] is True


def test_cli_unknown_arch_is_one_line(capsys):
    assert main(["simulate", "--arch", "nope"]) == 2
    err = capsys.readouterr().err
    assert "nope: no such architecture file or preset" in err and "mlx_4x4" in err
    assert err.count("\n") == 1


def test_cli_help_names_the_presets(capsys):
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "default, mlx_4x4, systolic_32x32" in help_text


def test_sweep_base_by_preset_name():
    def base(name):
        data = {"arch": {"base": name}, "workloads": [{"name": "gemm"}]}
        return sweep_from_dict(data).base_arch

    assert base("mlx_4x4")["name"] == "mlx-4x4" and base("mlx_4x4.yaml") == base("mlx_4x4")
    with pytest.raises(SweepError, match="no preset of that name.*mlx_4x4"):
        base("nope")


# ------------------------------------------------------------------ a regular install

def _dependency_dirs() -> list[str]:
    """Where this interpreter finds numpy, scipy and the rest, less any folder holding a `dataflow`
    package (the checkout). An editable install's finder is not carried along: it is started by
    a .pth file, and .pth files in a folder named by a path entry are not read."""
    return [p for p in sys.path if p and Path(p).is_dir()
            and not (Path(p) / "dataflow" / "__init__.py").exists()]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A virtualenv holding only the wheel built from this tree; its dependencies come from this
    interpreter's directories through a .pth file (no network, no editable finder)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"  # build from a copy: the wheel may hold only what the package declares
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "dataflow", src / "dataflow",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_"))}
    env["PIP_NO_INDEX"] = "1"
    dist = tmp / "dist"

    def run(*cmd, cwd=tmp):
        return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
                              check=False)

    built = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                "-w", str(dist), str(src))
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = dist.glob("dataflow-*.whl")
    venv = tmp / "venv"
    made = run(sys.executable, "-m", "venv", str(venv))
    assert made.returncode == 0, made.stderr
    py = venv / "bin" / "python"
    done = run(str(py), "-m", "pip", "install", "--no-deps", "--force-reinstall", str(wheel))
    assert done.returncode == 0, done.stdout + done.stderr
    site_dir = run(str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))")
    (Path(site_dir.stdout.strip()) / "zz_dependencies.pth").write_text(
        "\n".join(_dependency_dirs()) + "\n")
    workdir = tmp / "elsewhere"
    workdir.mkdir()
    return venv, workdir, run


@pytest.mark.slow
def test_wheel_holds_the_presets_and_runs_outside_the_repo(installed):
    venv, workdir, run = installed
    where = run(str(venv / "bin" / "python"), "-c",
                "import dataflow.arch as a; from dataflow.cuda.gpu_spec import load_gpu; "
                "print(a.__file__); print(a.preset_path('default')); "
                "print(*a.preset_names(), *a.preset_names('gpus')); print(load_gpu('h200').source)",
                cwd=workdir)
    assert where.returncode == 0, where.stderr
    module, default, names, gpu = where.stdout.splitlines()
    assert venv.resolve() in Path(module).resolve().parents, "the venv imported another dataflow"
    for f in (default, gpu):
        assert venv.resolve() in Path(f).resolve().parents and Path(f).is_file()
    assert names.split() == list(preset_names() + preset_names("gpus"))
    for arch in ("default", "mlx_4x4"):
        got = run(str(venv / "bin" / "dataflow"), "simulate", "--arch", arch, "--workload", "gemm",
                  "--m", "16", "--k", "16", "--n", "16", "--json", cwd=workdir)
        assert got.returncode == 0, got.stderr
        out = json.loads(got.stdout)
        assert out["values_match_reference"] is True
        here = simulate("gemm", arch=arch, m=16, k=16, n=16)
        assert (out["arch"], out["cycles"]) == (here.arch, here.cycles)
    text = run(str(venv / "bin" / "dataflow"), "simulate", "--workload", "gemm", "--m", "16",
               "--k", "16", "--n", "16", cwd=workdir)
    assert text.returncode == 0 and "values           match the numpy reference" in text.stdout
