"""Target files: every shipped file validates, host detection, preset topology, validator messages."""
import json
import os

import pytest

from coldbrew import targets
from coldbrew.targets import TargetError, available, load, resolve, validate

PRESETS = ["sd855", "sd765g", "helio_g80", "jetson_tx2", "jetson_nano"]


def _file(name):
    with open(os.path.join(targets.HERE, f"{name}.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("name", available())
def test_every_target_validates(name):
    t = resolve(name)
    assert t.name == name and t.features
    validate(t.to_dict(), name)  # to_dict is in the file format
    if name != "host":
        validate(_file(name), name)


def test_host_covers_usable_cores():
    t = resolve("host")
    assert t.core_ids == tuple(sorted(os.sched_getaffinity(0)))
    assert len(t.core_classes) >= 1 and not t.modeled and not t.storage.measured
    assert all(c.scale == (1.0, 1.0, 1.0) for c in t.core_classes)
    assert t.caches.l1d_kb > 0 and t.caches.l2_kb > 0
    assert resolve("host") is t  # cached per process


def test_host_classes_by_max_frequency(tmp_path):
    for i, khz in enumerate([1780000, 1780000, 2840000, 2420000]):
        os.makedirs(tmp_path / f"cpu{i}/cpufreq")
        (tmp_path / f"cpu{i}/cpufreq/cpuinfo_max_freq").write_text(f"{khz}\n")
    classes = targets._host_classes([0, 1, 2, 3], str(tmp_path))
    assert [(c["ids"], c["freq_mhz"]) for c in classes] == [([2], 2840), ([3], 2420), ([0, 1], 1780)]
    assert [c["relative_speed"] for c in classes] == [1.0, 0.85, 0.63]
    assert [c["name"] for c in targets._host_classes([0, 1, 7], str(tmp_path))] == ["core"]  # cpu7: no cpufreq


def test_host_caches_from_sysfs(tmp_path):
    for i, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "1024K"),
                                             (3, "Unified", "32M")]):
        d = tmp_path / f"cpu0/cache/index{i}"
        os.makedirs(d)
        for n, v in (("level", level), ("type", kind), ("size", size)):
            (d / n).write_text(f"{v}\n")
    assert targets._host_caches(0, str(tmp_path)) == {"l1d_kb": 48, "l2_kb": 1024, "l3_kb": 32768}


@pytest.mark.parametrize("name,cores,freqs", [
    ("sd855", [1, 3, 4], [2840, 2420, 1780]),
    ("sd765g", [1, 1, 6], [2400, 2200, 1800]),
    ("helio_g80", [2, 6], [2000, 1800]),
    ("jetson_tx2", [2, 4], [2000, 2000]),
    ("jetson_nano", [4], [1430]),
])
def test_preset_topology(name, cores, freqs):
    t = resolve(name)
    assert [len(c.ids) for c in t.core_classes] == cores
    assert [c.freq_mhz for c in t.core_classes] == freqs
    assert t.core_ids == tuple(range(sum(cores)))
    assert t.modeled and t.arch == "aarch64" and "neon" in t.features and t.gpu.api == "vulkan"
    assert "NNV12" in t.source and "modeled" in t.source


def test_sd855_little_ratios_follow_nnv12_fig6():
    t = resolve("sd855")
    big, little = t.core_class("big").scale, t.core_class("little").scale
    assert little.execute / big.execute == pytest.approx(6.0)
    assert little.read / big.read == pytest.approx(2.0)
    assert little.transform / big.transform == pytest.approx(3.8)
    assert t.class_of(7).name == "prime" and t.class_of(0).name == "little"
    with pytest.raises(KeyError, match="no core 8"):
        t.class_of(8)
    with pytest.raises(KeyError, match="no core class 'medium'"):
        t.core_class("medium")


def test_fingerprint_stable_and_distinct():
    fps = {n: resolve(n).fingerprint() for n in available()}
    assert len(set(fps.values())) == len(fps)
    assert load(os.path.join(targets.HERE, "sd855.json")).fingerprint() == fps["sd855"]
    assert fps["sd855"] == "952b9f685f34a6f4"  # update when sd855.json changes on purpose


def _broken(change):
    d = _file("sd855")
    change(d)
    return d


@pytest.mark.parametrize("change,message", [
    (lambda d: d["core_classes"][1]["ids"].append(7), r"'core_classes\[1\].ids' has core 7, which is already in class 'prime'"),
    (lambda d: d.pop("triple"), r"'triple' is missing"),
    (lambda d: d["core_classes"][2]["scale"].update(read=-1), r"'core_classes\[2\].scale.read' must be a number > 0"),
    (lambda d: d["core_classes"].reverse(), r"'core_classes\[0\].relative_speed' must be 1.0"),
    (lambda d: d.pop("features"), r"'features' is missing: modeled targets must list them"),
    (lambda d: d.update(features=["sme"]), r"'features' has 'sme', which the runtime does not check"),
    (lambda d: d.update(features=["avx2"]), r"'features' has 'avx2', which the runtime does not check for aarch64"),
    (lambda d: d["caches"].update(l2kb=1), r"'caches.l2kb' is not a known field"),
    (lambda d: d["gpu"].update(api="metal"), r"'gpu.api' must be one of vulkan"),
])
def test_validator_names_file_and_field(tmp_path, change, message):
    path = tmp_path / "sd855.json"
    path.write_text(json.dumps(_broken(change)))
    with pytest.raises(TargetError, match=f"^{tmp_path}/sd855.json: {message}"):
        load(str(path))


@pytest.mark.parametrize("name", [n for n in available() if n != "host"])
def test_preset_lists_exactly_what_llvm_derives(name):
    """A file's features are the ones a bundle records: LLVM's for its cpu, in CHECKED_FEATURES order."""
    d = _file(name)
    derived = list(targets._features_of(d["triple"], d["cpu"]))
    assert d.get("features") == derived
    assert list(resolve(name).features) == derived


@pytest.mark.parametrize("cpu,features", [
    ("generic", ["neon"]),
    ("cortex-a53", ["neon", "crc", "aes", "sha2"]),
    ("cortex-a57", ["neon", "crc", "aes", "sha2"]),
    ("cortex-a55", ["neon", "fp16", "dotprod", "rdm", "lse", "crc", "rcpc", "aes", "sha2"]),
    ("cortex-a75", ["neon", "fp16", "dotprod", "rdm", "lse", "crc", "rcpc", "aes", "sha2"]),
    ("cortex-a76", ["neon", "fp16", "dotprod", "rdm", "lse", "crc", "rcpc", "aes", "sha2"]),
    ("neoverse-v1", ["neon", "fp16", "dotprod", "rdm", "lse", "crc", "rcpc", "fhm", "i8mm", "bf16", "sve", "aes",
                     "sha2", "sha3", "fcma"]),
    ("neoverse-n2", ["neon", "fp16", "dotprod", "rdm", "lse", "crc", "rcpc", "fhm", "i8mm", "bf16", "sve", "sve2",
                     "fcma"]),
])
def test_aarch64_features_from_llvm_names(cpu, features):
    """LLVM's names (fullfp16, fp16fml, complxnum, ...) become the runtime's."""
    assert list(targets._features_of("aarch64-linux-gnu", cpu)) == features
    assert list(targets._features_of("aarch64-linux-android", cpu)) == features


def test_load_adds_llvm_features_to_listed_ones(tmp_path):
    """A file cannot under-report: LLVM's features for the cpu are added to those it lists
    (in CHECKED_FEATURES order); listing more than LLVM derives is kept."""
    d = _file("sd855")
    d["features"] = ["neon"]
    (tmp_path / "sd855.json").write_text(json.dumps(d))
    assert load(str(tmp_path / "sd855.json")).features == resolve("sd855").features
    d["features"] = ["sve", "neon"]
    (tmp_path / "sd855.json").write_text(json.dumps(d))
    assert load(str(tmp_path / "sd855.json")).features == ("neon", "fp16", "dotprod", "rdm", "lse", "crc", "rcpc",
                                                           "sve", "aes", "sha2")
    x = _file("x86_64-avx2")
    x.pop("features")
    (tmp_path / "x86_64-avx2.json").write_text(json.dumps(x))
    assert load(str(tmp_path / "x86_64-avx2.json")).features == resolve("x86_64-avx2").features


def test_load_checks_name_and_json(tmp_path):
    path = tmp_path / "phone.json"
    path.write_text(json.dumps(_file("sd855")))
    with pytest.raises(TargetError, match="'name' is 'sd855' but the file is named 'phone.json'"):
        load(str(path))
    path.write_text("{")
    with pytest.raises(TargetError, match="phone.json: cannot read target file"):
        load(str(path))
    with pytest.raises(TargetError, match="unknown target 'pixel9'"):
        resolve("pixel9")


def test_records_read_by_attribute_and_key():
    t = resolve("sd855")
    big = t.core_class("big")
    assert big.scale.execute == big.scale["execute"] == big["scale"][2] == 3.0
    assert t.storage["read_mb_s"] == t.storage.read_mb_s and t.gpu["name"] == "Adreno 640"
    with pytest.raises(KeyError):
        t.caches["l4_kb"]
    hash(t)  # frozen and hashable


@pytest.mark.parametrize("name,isa,lanes,regs", [("x86_64-avx2", "avx2", 8, 16), ("x86_64-avx512", "avx512", 16, 32),
                                                 ("aarch64", "neon", 4, 32), ("sd855", "neon", 4, 32),
                                                 ("jetson_nano", "neon", 4, 32)])
def test_vector_unit_from_the_isa(name, isa, lanes, regs):
    t = resolve(name)
    v = t.vector
    assert (v.isa, v.lanes, v.registers, v.fma) == (isa, lanes, regs, True)
    assert (v.l1d_kb, v.l2_kb) == (t.caches.l1d_kb, t.caches.l2_kb)


def test_host_vector_unit_matches_its_features():
    t = resolve("host")
    want = {"x86_64": "avx512" if "avx512f" in t.features else "avx2" if "avx2" in t.features else "sse",
            "aarch64": "neon"}[t.arch]
    assert t.vector.isa == want


def test_every_kernel_space_fits_the_register_file():
    """Register blocks come from the target: every default and searched
    block of the GEMM variants fits the register file (accumulators +
    operands), and widths are whole vectors where the variant vectorizes
    the width."""
    from coldbrew.compiler.kernels import ConvSpec, applicable

    specs = [ConvSpec(1, 64, 56, 56, 64, 1, 1), ConvSpec(1, 256, 14, 14, 256, 3, 3, (1, 1), (1, 1, 1, 1)),
             ConvSpec(1, 512, 7, 7, 512, 3, 3, (1, 1), (1, 1, 1, 1))]
    for name in ("x86_64-avx2", "x86_64-avx512", "aarch64"):
        isa = resolve(name).vector
        for spec in specs:
            for v in applicable(spec, "conv2d", isa):
                assert v.isa == isa
                for p in v.space(spec):
                    if "zt" in p and "kb" in p:  # width-vectorized GEMM: kb x zt / lanes accumulators
                        assert p["zt"] % isa.lanes == 0
                        vecs = p["zt"] // isa.lanes
                        assert p["kb"] * vecs + vecs + 2 <= isa.registers, (name, v.name, p)
                    if "kvb" in p:  # channels in the lanes: zt x kvb accumulators
                        assert p["zt"] * p["kvb"] + p["kvb"] + 2 <= isa.registers, (name, v.name, p)
                    if "tt" in p:  # winograd: kb x tt / lanes accumulators
                        assert p["tt"] % isa.lanes == 0
                        assert p["kb"] * (p["tt"] // isa.lanes) + p["tt"] // isa.lanes + 2 <= isa.registers


@pytest.mark.parametrize("speeds,shares", [
    ([1.0, 1.0], [1, 1]), ([1.0, 0.99], [1, 1]), ([1.0, 0.5], [2, 1]), ([1.0, 0.14], [7, 1]),
    ([1.0, 0.85, 0.85, 0.85], [1, 1, 1, 1]),  # 4 % to gain, not worth cutting loops finer
    ([1.0, 0.85, 0.85, 0.85, 0.14, 0.14, 0.14, 0.14], [7, 6, 6, 6, 1, 1, 1, 1]),
])
def test_task_shares_follow_core_speeds(speeds, shares):
    assert targets.task_shares(speeds) == shares


@pytest.mark.parametrize("name", PRESETS + ["x86_64-avx2", "host"])
@pytest.mark.parametrize("threads", [1, 2, 4, 8])
def test_split_by_speed_never_slower_than_even(name, threads):
    speeds = resolve(name).exec_speeds(threads)
    shares = targets.task_shares(speeds)
    assert len(shares) == threads and all(1 <= s <= 255 for s in shares)
    assert sum(shares) <= targets.MAX_TASKS * threads
    by_speed, even = targets.split_factor(speeds, shares), targets.split_factor(speeds, [1] * threads)
    assert threads / sum(speeds) - 1e-9 <= by_speed <= even + 1e-9  # no better than ideal, no worse than even


def test_exec_speeds_fastest_class_first():
    assert resolve("sd855").exec_speeds(5) == [1.0, 0.85, 0.85, 0.85, 0.14]
    assert resolve("sd855").exec_speeds(10)[-2:] == [0.14, 0.14]  # more threads than cores share the slowest


def test_amx_tiles_from_cpuinfo_and_passed_to_llvm(tmp_path):
    """A host's AMX comes from the kernel's flags (LLVM's name for a
    virtual machine's CPU can be an older core without it); the features
    are then recorded, handed to LLVM explicitly, and the vector unit has
    int8 tiles; a flags line without them adds nothing."""
    import dataclasses

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx512f avx512_vnni amx_bf16 amx_tile amx_int8\n")
    assert targets._cpuinfo_features(str(info)) == ("amx-tile", "amx-int8")
    info.write_text("processor\t: 0\nflags\t\t: fpu avx512f avx512_vnni\n")
    assert targets._cpuinfo_features(str(info)) == ()
    assert targets._cpuinfo_features(str(tmp_path / "absent")) == ()
    base = resolve("x86_64-avx512")
    t = dataclasses.replace(base, features=base.features + ("avx512vnni", "amx-tile", "amx-int8"))
    assert t.llvm()["mattr"] == ["+amx-tile", "+amx-int8"] and t.vector.int8_tiles
    assert "mattr" not in base.llvm() and not base.vector.int8_tiles
    host = resolve("host")
    if targets._cpuinfo_features() == targets.EXPLICIT_FEATURES:
        assert {"amx-tile", "amx-int8"} <= set(host.features)
