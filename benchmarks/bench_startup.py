"""Start-up benchmark (issue 14 point 1): whole-process wall time of the commands a user waits on.

Each command runs as a new process of this interpreter, with this checkout first on the path:
- `python -c pass`: the interpreter's own start, the floor under everything else;
- `import dataflow`;
- `dataflow --help`;
- `dataflow simulate --arch arch_configs/default.yaml --workload spmm` (the README's first job),
  warm: one untimed run first fills the plan, Numba and file caches.

Two columns: `as run` uses the environment as it is (where PYTHONDONTWRITEBYTECODE is set, every
process compiles dataflow's sources again); `bytecode` lets Python keep compiled bytecode (in a
temporary PYTHONPYCACHEPREFIX, so the checkout stays clean), as an installed wheel has it.
Times are the best (and the median) of `--repeats` runs of wall time, and the best CPU time
(user + system) of the process: on a shared machine the wall time grows with the load, the CPU
time much less, so when the two differ a lot the machine was busy. The targets are for the
wall time. The table is printed and written to benchmarks/out/bench_startup.json.

    python benchmarks/bench_startup.py [--repeats N] [--quick] [--checkout DIR]

`--checkout DIR` times another source tree of dataflow the same way (an older commit, for a
before/after), writing nothing there.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "out"

#: (name, argv after the interpreter, target in seconds or None)
COMMANDS = (
    ("python -c pass", ["-c", "pass"], None),
    ("import dataflow", ["-c", "import dataflow"], None),
    ("dataflow --help", ["-m", "dataflow.cli", "--help"], 0.3),
    ("dataflow simulate --workload spmm (warm)",
     ["-m", "dataflow.cli", "simulate", "--arch", "arch_configs/default.yaml",
      "--workload", "spmm"], 0.5),
)


def _env(root: Path, bytecode_dir: str | None) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(root), *filter(None, [os.environ.get("PYTHONPATH")])]))
    if bytecode_dir is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = bytecode_dir
    return env


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _once(root: Path, argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one process running `argv` in `root`."""
    c0, t0 = _cpu(), time.perf_counter()
    subprocess.run([sys.executable, *argv], cwd=root, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0, _cpu() - c0


def measure(root: Path, repeats: int) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="dataflow-pyc-") as pyc:
        modes = {"as run": _env(root, None), "bytecode": _env(root, pyc)}
        for name, argv, target in COMMANDS:
            row = {"command": name, "argv": argv, "target_s": target}
            for mode, env in modes.items():
                _once(root, argv, env)  # warm-up: the caches, and the bytecode column's bytecode
                runs = [_once(root, argv, env) for _ in range(repeats)]
                wall = [w for w, _ in runs]
                row[mode] = {"best_s": min(wall), "median_s": statistics.median(wall),
                             "cpu_best_s": min(c for _, c in runs), "runs_s": wall}
            rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    """One line a command: target, then per column the best wall time (against the target),
    the median wall time and the best CPU time, in seconds."""
    head = f"{'':<42} {'':>6}  {'as run':^24}  {'bytecode':^24}"
    sub = f"{'command':<42} {'target':>6}" + f"  {'best':>9} {'median':>6} {'cpu':>6}" * 2
    lines = [head, sub]
    for r in rows:
        target = r["target_s"]
        line = f"{r['command']:<42} {f'{target:.2f}' if target else '-':>6}"
        for mode in ("as run", "bytecode"):
            m = r[mode]
            mark = "" if target is None else (" ok" if m["best_s"] < target else " !!")
            line += f"  {m['best_s']:>6.3f}{mark:<3} {m['median_s']:>6.3f} {m['cpu_best_s']:>6.3f}"
        lines.append(line)
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7, help="timed runs per command and column")
    ap.add_argument("--quick", action="store_true", help="3 timed runs")
    ap.add_argument("--checkout", type=Path, default=ROOT, metavar="DIR",
                    help="the source tree to time (default: this one)")
    args = ap.parse_args()
    repeats = 3 if args.quick else max(1, args.repeats)
    root = args.checkout.resolve()
    rows = measure(root, repeats)
    machine = (f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
               f", PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}")
    print(f"start-up of {root}, whole processes, best of {repeats} ({machine})")
    print(table(rows))
    OUT.mkdir(parents=True, exist_ok=True)
    out = OUT / "bench_startup.json"
    out.write_text(json.dumps({"checkout": str(root), "machine": machine, "repeats": repeats,
                               "rows": rows}, indent=2))
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
