"""Contracts between stages: dead-node removal keeps the loop-carried edges in step with the
renumbered nodes; a program says in typed fields what the mapper branches on; the architecture
words a caller branches on are enums that load from, and go back to, the YAML strings."""

import dataclasses
import json

import numpy as np
import pytest
import yaml

from dataflow.arch import ArchError, arch_from_dict, arch_to_dict, resolve_arch
from dataflow.arch.spec import AddressMapping, PEKind, Topology
from dataflow.dfg.graph import (
    Addr,
    Buffer,
    BufferFetch,
    BufferRole,
    GemmShape,
    Kernel,
    Loop,
    Node,
    Program,
)
from dataflow.dfg.lower import drop_dead_nodes, lower_gemm, lower_spmm_csr, run_passes
from dataflow.dfg.lower_butterfly import ButterflyKind, ButterflySpec
from dataflow.dfg.ops import Op
from dataflow.mapper.map import map_program
from dataflow.mapper.mapping import MappingError
from dataflow.ust_frontend.plan import arch_hash
from tests.archs import default_dict


def _row_sum_with_dead_nodes() -> Program:
    """C[i] += A[i, kk] with a dead load and a dead multiply (carrying its own value) placed
    before the accumulator, so the accumulator's id moves from 3 to 1."""
    nodes = (
        Node(0, Op.LOAD, buffer="A", addr=Addr((("i", 4), ("kk", 1))), name="a"),
        Node(1, Op.LOAD, buffer="B", addr=Addr((("kk", 1),)), name="dead b"),
        Node(2, Op.MUL, (1, 1), name="dead b*b"),
        Node(3, Op.ACC, (0,), buffer="C", addr=Addr((("i", 1),)), name="C+="),
    )
    kern = Kernel(name="row_sum", loops=(Loop("i", 3), Loop("kk", 4)), nodes=nodes,
                  buffers=(Buffer("A", 12), Buffer("B", 4), Buffer("C", 3, "output")),
                  carried=((2, 2, 1), (3, 3, 1)))
    return Program(name="row_sum", kernels=(kern,),
                   inputs=(("A", np.ones(12, np.float32)), ("B", np.ones(4, np.float32))),
                   outputs=(("C", (3,)),), macs=12)


def test_drop_dead_nodes_renumbers_and_drops_carried_edges():
    kern = drop_dead_nodes(_row_sum_with_dead_nodes()).kernels[0]
    assert [(n.id, n.op, n.inputs) for n in kern.nodes] == [(0, Op.LOAD, ()), (1, Op.ACC, (0,))]
    # the accumulator's recurrence follows it to id 1; the dead multiply's goes with it
    assert kern.carried == ((1, 1, 1),)
    kern.verify()


def test_run_passes_accepts_a_kernel_with_dead_nodes_before_a_carried_edge():
    prog = run_passes(_row_sum_with_dead_nodes())  # verify_pass runs after the drop
    assert len(prog.kernels[0].nodes) == 2


def test_drop_dead_nodes_keeps_a_carried_source_alive():
    """A node whose value reaches a store only through a loop-carried edge is live."""
    nodes = (
        Node(0, Op.LOAD, buffer="A", addr=Addr((("i", 1),)), name="a"),
        Node(1, Op.ACC, (0,), buffer="C", addr=Addr((("i", 0),)), name="C+="),
        Node(2, Op.LOAD, buffer="B", addr=Addr((("i", 1),)), name="b (carried only)"),
    )
    kern = Kernel(name="carried_only", loops=(Loop("o", 1), Loop("i", 4)), nodes=nodes,
                  buffers=(Buffer("A", 4), Buffer("B", 4), Buffer("C", 1, "output")),
                  carried=((2, 1, 1), (1, 1, 1)))
    prog = Program(name="carried_only", kernels=(kern,),
                   inputs=(("A", np.ones(4, np.float32)), ("B", np.ones(4, np.float32))),
                   outputs=(("C", (1,)),))
    assert drop_dead_nodes(prog).kernels[0] is kern


def test_a_gemm_program_carries_its_shape_for_the_systolic_mapper():
    prog = lower_gemm(np.ones((5, 3)), np.ones((3, 7)))
    assert prog.gemm == GemmShape(m=5, n=7, k=3)
    sm = map_program(prog, resolve_arch("systolic_32x32")).kernels[0]
    assert (sm.m, sm.n, sm.k) == (5, 7, 3)


def test_the_systolic_mapper_refuses_a_program_without_a_gemm_shape():
    pos, crd = np.array([0, 1, 2]), np.array([0, 1])
    prog = lower_spmm_csr((2, 2), pos, crd, np.ones(2), np.ones((2, 4)))
    assert prog.gemm is None
    with pytest.raises(MappingError, match="runs only dense GEMM"):
        map_program(prog, resolve_arch("systolic_32x32"))


def test_arch_words_load_as_enums_and_dump_as_strings():
    arch = resolve_arch("default")
    assert arch.pe_array.kind is PEKind.RECONFIGURABLE
    assert arch.interconnect.topology is Topology.MESH
    assert arch.spm.address_mapping is AddressMapping.INTERLEAVED
    data = arch_to_dict(arch)
    assert type(data["spm"]["address_mapping"]) is str  # YAML and JSON see the plain word
    assert yaml.safe_load(yaml.safe_dump(data)) == data
    assert arch_from_dict(data, source=arch.source) == arch
    assert f"{arch.pe_array.kind}" == "reconfigurable"  # messages read as before


def test_a_plain_string_spec_equals_and_hashes_as_the_enum_spec():
    """dataclasses.replace with the YAML word (as sweeps and tests do) gives the same plan-cache
    key and architecture hash as the loaded member."""
    arch = resolve_arch("default")
    spm = dataclasses.replace(arch.spm, address_mapping="interleaved")
    plain = dataclasses.replace(arch, spm=spm)
    assert plain == arch and hash(plain) == hash(arch) and arch_hash(plain) == arch_hash(arch)
    assert json.dumps(arch_to_dict(plain)) == json.dumps(arch_to_dict(arch))


@pytest.mark.parametrize("section, key, allowed", [
    ("pe_array", "kind", "('reconfigurable', 'systolic')"),
    ("interconnect", "topology", "('mesh', 'torus')"),
    ("spm", "address_mapping", "('interleaved', 'blocked', 'xor')"),
])
@pytest.mark.parametrize("bad", ["hashed", 3])
def test_an_unknown_arch_word_names_file_key_and_allowed_values(section, key, allowed, bad):
    d = default_dict()
    d = {**d, section: {**d.get(section, {}), key: bad}}
    with pytest.raises(ArchError) as exc:
        arch_from_dict(d, source="bad.yaml")
    msg = str(exc.value)
    assert "bad.yaml" in msg and f"{section}.{key}" in msg
    assert f"must be one of {allowed}, got {bad!r}" in msg


def test_dfg_words_are_enums_that_equal_their_words():
    assert Buffer("C", 4, "output").role == BufferRole.OUTPUT
    assert Buffer("A", 4).role is BufferRole.INPUT and Buffer("A", 4).fetch is BufferFetch.WHOLE
    plain = ButterflySpec(n=8, batch=4, lanes=4, kind="real")
    typed = ButterflySpec(n=8, batch=4, lanes=4, kind=ButterflyKind.REAL)
    assert plain == typed and hash(plain) == hash(typed) and not typed.complex_data
    assert f"butterfly_{typed.kind}" == "butterfly_real"  # program names unchanged
