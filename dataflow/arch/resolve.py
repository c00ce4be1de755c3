"""Architecture presets by name, and `resolve_arch`: the one place that turns what a user wrote
(`None`, an `ArchSpec`, a path, or a preset name) into an `ArchSpec`.

The presets live inside the package (`dataflow/arch/presets/`, shipped as package data) so an
installed wheel finds them wherever it runs; the repository's `arch_configs/` is a link to that
folder, so the paths in the README, tests and notebooks keep working. GPU descriptions sit in
`presets/gpus/` and are named `gpus/NAME` (they are read by `dataflow.cuda.gpu_spec`, not here).
"""

from __future__ import annotations

from pathlib import Path

from dataflow.arch.load import ArchError, load_arch
from dataflow.arch.spec import ArchSpec

PRESET_DIR = Path(__file__).resolve().parent / "presets"
GPU_GROUP = "gpus"
DEFAULT_PRESET = "default"


def preset_names(group: str = "") -> tuple[str, ...]:
    """Preset names, sorted: the architectures (`default`, `mlx_4x4`, ...) when `group` is empty,
    else that subfolder's files with the folder as prefix (`gpus/h200`)."""
    folder = PRESET_DIR / group if group else PRESET_DIR
    prefix = f"{group}/" if group else ""
    return tuple(sorted(prefix + f.stem for f in folder.glob("*.yaml")))


def _preset_file(name: str) -> Path | None:
    """The file of preset `name` (`default`, `default.yaml`, `gpus/h200`), or None."""
    stem = name.removesuffix(".yaml")
    group = stem.rpartition("/")[0]
    if group not in ("", GPU_GROUP) or stem not in preset_names(group):
        return None
    return PRESET_DIR / f"{stem}.yaml"


def preset_path(name: str) -> Path:
    """The YAML file of a preset: `default`, `mlx_4x4.yaml`, `gpus/h200`. An unknown name raises
    `ArchError` listing the presets."""
    path = _preset_file(str(name))
    if path is None:
        raise ArchError(str(name), "", "no such preset; presets: " + _listing())
    return path


def _listing() -> str:
    return ", ".join(preset_names() + preset_names(GPU_GROUP))


def resolve_arch(arch: ArchSpec | str | Path | None) -> ArchSpec:
    """`None` → the `default` preset; an `ArchSpec` → itself; an existing file → loaded; else a
    preset name (`default`, `mlx_4x4`, `systolic_32x32`, with or without `.yaml`)."""
    if arch is None:
        return load_arch(preset_path(DEFAULT_PRESET))
    if isinstance(arch, ArchSpec):
        return arch
    if Path(arch).is_file():  # a file the user names wins over a preset of the same name
        return load_arch(arch)
    path = _preset_file(str(arch))
    if path is None:
        raise ArchError(str(arch), "", "no such architecture file or preset; presets: "
                        + ", ".join(preset_names()) + " (or give the path of a .yaml file)")
    if path.parent != PRESET_DIR:
        # gpus/NAME describes a GPU (dataflow.cuda.gpu_spec), not a dataflow array: loading it
        # as one would only complain about its first unknown key
        raise ArchError(str(arch), "", "this preset describes a GPU, not a dataflow "
                        f"architecture; give it to `dataflow compare --gpu {path.stem}`; "
                        "architecture presets: " + ", ".join(preset_names()))
    return load_arch(path)
