"""bench_engine.py section 3: the mapper over a corpus of kernels -- every kernel the
registered workloads map at small sizes on three architectures, plus seeded random DFGs
(tests/programs.py): II against MII, mapping-time percentiles, and what annealing changes."""

from __future__ import annotations

import os
import time

import numpy as np

import dataflow
import dataflow.mapper.map as map_module


def corpus(quick: bool):
    """(label, kernel, arch) for every kernel the workloads map, plus random DFGs."""
    from tests.archs import variant
    from tests.programs import random_program

    archs = {"default-8x8": variant(), "4x4": variant(**{"pe_array.rows": 4, "pe_array.cols": 4}),
             "torus-skip": variant(**{"interconnect.topology": "torus",
                                      "interconnect.skip_hop_strides": [2]})}
    runs = [("gemm", {"m": 32, "k": 16, "n": 16}),
            ("spmm", {"m": 64, "k": 64, "n": 16, "density": 0.1}),
            ("attention", {"seq": 32, "dim": 16}),
            ("moe", {"tokens": 16, "dim": 16, "hidden": 16, "experts": 4}),
            ("dynamic-spmm", {"m": 64, "k": 64, "n": 16}),
            ("relu-ffn", {"tokens": 32, "dim": 32, "hidden": 64}),
            ("butterfly", {"n": 32, "batch": 4}), ("fft", {"n": 16, "batch": 4})]
    from dataflow.workloads import workloads
    known = workloads()
    captured = []
    orig = map_module.map_kernel

    def grab(kernel, arch, *a, **kw):
        captured.append((kernel, arch, a, kw))
        return orig(kernel, arch, *a, **kw)

    # every module that calls map_kernel by its own name (the schedule search in plan/compile
    # and the stage mapper), patched for the capture; an empty plan cache, so a warm one on
    # this machine does not hide kernels (the corpus held 58 kernels instead of 111 when
    # plan/compile's calls went uncaptured)
    import tempfile

    import dataflow.plan.compile as compile_module
    import dataflow.plan.stage_mapping as orch_module
    patched = [(m, m.map_kernel) for m in (map_module, orch_module, compile_module)]
    for m, _ in patched:
        m.map_kernel = grab
    saved_cache = os.environ.get("DATAFLOW_CACHE_DIR")
    tmp = tempfile.TemporaryDirectory(prefix="bench-corpus-")
    os.environ["DATAFLOW_CACHE_DIR"] = tmp.name
    try:
        for aname, arch in (list(archs.items())[:1] if quick else archs.items()):
            for wl, params in runs:
                if wl not in known:
                    continue
                before = len(captured)
                try:
                    dataflow.simulate(wl, arch=arch, **params)
                except Exception as exc:  # noqa: BLE001 - a workload that does not fit this arch is reported, not fatal
                    print(f"  corpus: {wl} on {aname} skipped ({type(exc).__name__}: {exc})")
                for i in range(before, len(captured)):
                    captured[i] = (f"{wl}/{captured[i][0].name}@{aname}",) + captured[i]
    finally:
        for m, f in patched:
            m.map_kernel = f
        if saved_cache is None:
            os.environ.pop("DATAFLOW_CACHE_DIR", None)
        else:
            os.environ["DATAFLOW_CACHE_DIR"] = saved_cache
        tmp.cleanup()
    last = {}  # the last call per kernel wins: orchestration retries a failed one with more slack
    for label, kernel, arch, _a, kw in captured:
        if kw.get("max_ii_slack", 8) < 8:
            # an extra-copies probe capped at the IIs that could win (`stage_mapping`):
            # replayed with map_kernel's default slack, the problem the corpus always held
            kw = {k: v for k, v in kw.items() if k != "max_ii_slack"}
        last[(label, len(kernel.nodes))] = ("workload", label, kernel, arch, kw)
    items = list(last.values())
    for s in range(10 if quick else 30):
        prog = random_program(s)
        for kern in prog.kernels:
            items.append(("random", f"random{s}/{kern.name}", kern, archs["default-8x8"], {}))
    return items


def mapper_stats(quick: bool):
    items = corpus(quick)
    rows = []
    for group, label, kernel, arch, kw in items:
        kw = {k: v for k, v in kw.items() if k in ("max_tile_rows", "copies", "max_ii_slack")}
        map_module.SCHEDULES.clear()  # each kernel cold: no attempt of an earlier one reused
        t0 = time.perf_counter()
        try:
            km = map_module.map_kernel(kernel, arch, **kw)
        except map_module.MappingError as exc:
            print(f"  unmapped: {label}: {exc}")
            rows.append({"group": group, "kernel": label, "nodes": len(kernel.nodes), "copies": 0,
                             "ii": None, "mii": None, "seconds": time.perf_counter() - t0})
            continue
        dt = time.perf_counter() - t0
        rows.append({"group": group, "kernel": label, "nodes": len(kernel.nodes),
                     "copies": km.copies, "ii": km.ii, "mii": km.mii, "res_mii": km.res_mii,
                     "rec_mii": km.rec_mii, "seconds": dt, "length": km.schedule_length,
                     "hops": sum(len(r.links) for r in km.routes)})
    times = np.array([r["seconds"] for r in rows])
    print(f"\nmapper corpus: {len(rows)} kernels")
    print(f"{'kernel':44} {'nodes':>5} {'copies':>6} {'II':>3} {'MII':>4} {'seconds':>8}")
    for r in rows:
        print(f"{r['kernel'][:44]:44} {r['nodes']:>5} {r['copies']:>6} {r['ii']!s:>3} "
              f"{r['mii']!s:>4} {r['seconds']:>8.3f}")
    summary = {}
    for group in ("workload", "random", "all"):
        sel = [r for r in rows if group == "all" or r["group"] == group]
        if not sel:
            continue
        t = np.array([r["seconds"] for r in sel])
        summary[group] = {"kernels": len(sel),
                              "ii_eq_mii": sum(r["ii"] is not None and r["ii"] == r["mii"]
                                            for r in sel) / len(sel),
                              "unmapped": sum(r["ii"] is None for r in sel),
                              "mean_ii_over_mii": float(np.mean([r["ii"] / r["mii"] for r in sel
                                                              if r["ii"] is not None])),
                              "p50_s": float(np.percentile(t, 50)),
                              "p90_s": float(np.percentile(t, 90)),
                              "max_s": float(t.max())}
    print(f"\n{'group':10} {'kernels':>7} {'unmapped':>8} {'II=MII':>7} {'mean II/MII':>12} "
          f"{'p50 s':>7} {'p90 s':>7} {'max s':>7}")
    for g, s in summary.items():
        print(f"{g:10} {s['kernels']:>7} {s['unmapped']:>8} {100 * s['ii_eq_mii']:>6.0f}% "
              f"{s['mean_ii_over_mii']:>12.2f} "
              f"{s['p50_s']:>7.3f} {s['p90_s']:>7.3f} {s['max_s']:>7.3f}")
    print("targets: II = MII on >= 90 % of kernels; p90 mapping time < 5 s (CGRA-ME: 7.9 s; "
          "issue 14: < 1 s)")
    # the annealing pass on the random kernels: schedule length and link hops before/after
    ann = []
    randoms = [i for i in items if i[0] == "random"]
    for _group, label, kernel, arch, _ in randoms[: 6 if quick else 12]:
        base = map_module.map_kernel(kernel, arch)
        t0 = time.perf_counter()
        imp = map_module.map_kernel(kernel, arch, improve="anneal")
        ann.append({"kernel": label, "length": (base.schedule_length, imp.schedule_length),
                        "hops": (sum(len(r.links) for r in base.routes),
                              sum(len(r.links) for r in imp.routes)),
                        "seconds": time.perf_counter() - t0})
    if ann:
        lb = sum(a["length"][0] for a in ann)
        la = sum(a["length"][1] for a in ann)
        hb = sum(a["hops"][0] for a in ann)
        ha = sum(a["hops"][1] for a in ann)
        print(f"\nimprove='anneal' on {len(ann)} random kernels: "
              f"total schedule length {lb} -> {la}, link hops {hb} -> {ha}, "
              f"mean {np.mean([a['seconds'] for a in ann]):.2f} s per kernel")
    return rows, summary, ann, times


