import pytest
import yaml

from dataflow.arch import ArchError, arch_from_dict, arch_to_dict, load_arch
from tests.archs import default_dict
from tests.conftest import ARCH_DIR


@pytest.mark.parametrize("name", ["default.yaml", "systolic_32x32.yaml"])
def test_presets_load_and_round_trip(name):
    spec = load_arch(ARCH_DIR / name)
    again = arch_from_dict(arch_to_dict(spec), source=str(ARCH_DIR / name))
    assert again == spec
    assert hash(again) == hash(spec)


def _write(tmp_path, data):
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


@pytest.mark.parametrize("change, key_path, fragment", [
    (lambda d: d["spm"].__setitem__("linez", 4), "spm.linez", "unknown key 'linez'"),
    (lambda d: d.__setitem__("colour", "red"), "colour", "unknown key"),
    (lambda d: d["pe_array"].__setitem__("rows", "eight"), "pe_array.rows", "expected an integer"),
    (lambda d: d["pe_array"].__setitem__("rows", 0), "pe_array.rows", "must be > 0"),
    (lambda d: d["spm"].__setitem__("read_ports_per_line", -1), "spm.read_ports_per_line",
     "must be > 0"),
    (lambda d: d["dram"].__setitem__("bytes_per_cycle", 0), "dram.bytes_per_cycle", "must be > 0"),
    (lambda d: d["spm"].__setitem__("address_mapping", "hashed"), "spm.address_mapping",
     "must be one of"),
    (lambda d: d["spm"].__setitem__("words_per_row", 4), "spm.words_per_row", "SIMD vector"),
    (lambda d: d["pe_array"]["functional_units"][0]["ops"].append("teleport"),
     "pe_array.functional_units[0].ops", "unknown op 'teleport'"),
    (lambda d: d["pe_array"]["functional_units"][1]["ops"].append("load"),
     "pe_array.functional_units[1].ops", "already executed"),
    (lambda d: d["interconnect"].__setitem__("skip_hop_strides", [9]),
     "interconnect.skip_hop_strides[0]", "stride must be in"),
    (lambda d: d.__setitem__("word_bytes", 2), "word_bytes", "float32 words are 4 bytes"),
    (lambda d: d.pop("spm"), "spm", "required key is missing"),
])
def test_bad_values_name_file_and_key_path(tmp_path, change, key_path, fragment):
    d = default_dict()
    change(d)
    path = _write(tmp_path, d)
    with pytest.raises(ArchError) as info:
        load_arch(path)
    msg = str(info.value)
    assert str(path) in msg
    assert f"{key_path}:" in msg
    assert fragment in msg
    assert info.value.key_path == key_path


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ArchError, match="cannot read"):
        load_arch(tmp_path / "nope.yaml")
    p = tmp_path / "x.yaml"
    p.write_text("pe_array: [unclosed")
    with pytest.raises(ArchError, match="not valid YAML"):
        load_arch(p)
