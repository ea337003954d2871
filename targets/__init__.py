"""Target descriptions: the CPU a bundle's code is built for, its cores grouped
in classes, caches, storage and GPU.

`host` is detected (LLVM's view of this machine's CPU, the usable cores, sysfs);
other targets are JSON files in this folder, checked by `schema.validate`
(format: targets/README.md). The features a bundle records are those the
runtime can check on the running CPU (runtime/src/bundle/target.c), so a bundle for
another CPU is refused with a message instead of dying on an illegal
instruction. They are never fewer than LLVM enables for the triple and cpu
(the code is compiled for exactly those): a file's `features` are added to
LLVM's, never used instead of them.

Presets with `modeled: true` describe devices we do not have: their cost
tables are host measurements multiplied by each core class's `scale`, and
every figure derived from them must say "modeled".
"""
import functools
import glob
import hashlib
import json
import os
import platform
from dataclasses import dataclass
from typing import NamedTuple, Optional

from .schema import CHECKED_FEATURES, PHASES, TargetError, validate

HERE = os.path.dirname(os.path.abspath(__file__))
SYSFS_CPU = "/sys/devices/system/cpu"
# Nominal until the profiler measures this machine's storage.
HOST_STORAGE = {"read_mb_s": 1000, "latency_us": 100, "measured": False}


def _by_name(self, key):
    """Records also read like the file's objects: scale["read"] is scale.read."""
    if not isinstance(key, str):
        return tuple.__getitem__(self, key)
    if key not in self._fields:
        raise KeyError(key)
    return getattr(self, key)


class Scale(NamedTuple):
    """How many times slower than the host core each phase runs."""
    read: float
    transform: float
    execute: float
    __getitem__ = _by_name


class CoreClass(NamedTuple):
    name: str
    ids: tuple
    relative_speed: float  # execute speed relative to the target's fastest class (1.0)
    freq_mhz: Optional[float]  # None where unknown
    scale: Scale
    __getitem__ = _by_name


class Caches(NamedTuple):
    l1d_kb: int
    l2_kb: int
    l3_kb: int  # 0: none
    __getitem__ = _by_name


class Storage(NamedTuple):
    read_mb_s: float
    latency_us: float
    measured: bool
    __getitem__ = _by_name


class Vector(NamedTuple):
    """What the kernel schedules need to know about the CPU's vector unit.
    Derived from the ISA features (`vector_unit`), so every target has one."""
    isa: str  # "avx512", "avx2", "sse", "neon"
    lanes: int  # fp32 lanes per vector register
    registers: int  # architectural vector registers
    fma: bool  # fused multiply-add
    l1d_kb: int  # the fastest class's data caches, for tile sizes
    l2_kb: int
    int8_dot: bool = False  # u8 x s8 dot products into int32 lanes (AVX-512 VNNI vpdpbusd: 64 per instruction)
    int8_tiles: bool = False  # u8 x s8 tile products (AMX tdpbusd: 16 x 16 outputs x 64 per instruction)
    l3_kb: int = 0  # the last-level cache past L2; 0: none or unknown
    __getitem__ = _by_name


def vector_unit(arch, features, caches):
    """The Vector of a CPU with `features` (AVX-512 F: 16 lanes and 32
    registers; AVX2: 8 and 16; SSE: 4 and 16; NEON: 4 and 32), with
    AVX-512 VNNI's int8 dot products and AMX's int8 tiles where the
    features name them."""
    f = set(features)
    if arch == "aarch64":
        isa, lanes, regs, fma = "neon", 4, 32, True
    elif "avx512f" in f:
        isa, lanes, regs, fma = "avx512", 16, 32, True
    elif "avx2" in f:
        isa, lanes, regs, fma = "avx2", 8, 16, "fma" in f
    else:
        isa, lanes, regs, fma = "sse", 4, 16, False
    return Vector(isa, lanes, regs, fma, caches.l1d_kb, caches.l2_kb, isa == "avx512" and "avx512vnni" in f,
                  isa == "avx512" and {"amx-tile", "amx-int8"} <= f, caches.l3_kb)


class Gpu(NamedTuple):
    api: str
    name: str
    device_class: str
    compute_units: int
    __getitem__ = _by_name


@dataclass(frozen=True)
class Target:
    name: str
    triple: str
    cpu: str
    features: tuple
    description: str
    core_classes: tuple  # of CoreClass, fastest first
    caches: Caches  # of the fastest class's cores
    storage: Storage
    gpu: Optional[Gpu]
    modeled: bool
    source: str
    executes_on: str = "cpu"  # "gpu": layers run as shaders on the target's GPU (targets.resolve "vulkan")
    blocks_of: Optional[Vector] = None  # a multi-target bundle's later CPU section: the first's vector model

    @property
    def vector(self):
        """The vector unit the kernels are scheduled for: the CPU's own, or,
        in a section sharing another CPU target's weight layouts
        (`blocks_of`), that target's lanes, registers and caches (NEON
        running 8-lane blocks as register pairs), this CPU's own ISA,
        FMA and int8 instructions."""
        own = vector_unit(self.arch, self.features, self.caches)
        if self.blocks_of is None:
            return own
        b = self.blocks_of
        return own._replace(lanes=b.lanes, registers=b.registers, l1d_kb=b.l1d_kb, l2_kb=b.l2_kb)

    @property
    def arch(self):
        return self.triple.split("-")[0]

    @property
    def core_ids(self):
        return tuple(sorted(i for c in self.core_classes for i in c.ids))

    def exec_speeds(self, threads):
        """Relative execute speed of each of `threads` execution threads: the
        runtime runs them on the target's cores fastest class first (more
        threads than cores share the slowest)."""
        speeds = [c.relative_speed for c in self.core_classes for _ in c.ids]
        return [speeds[min(k, len(speeds) - 1)] for k in range(threads)]

    def llvm(self):
        """The TVM target dict for this CPU (with the features its cpu may
        not imply: AMX where detected on a host LLVM names otherwise)."""
        extra = [f"+{f}" for f in self.features if f in EXPLICIT_FEATURES]
        return {"kind": "llvm", "mtriple": self.triple, "mcpu": self.cpu, **({"mattr": extra} if extra else {})}

    def core_class(self, name):
        for c in self.core_classes:
            if c.name == name:
                return c
        raise KeyError(f"target '{self.name}' has no core class '{name}' "
                       f"(has: {', '.join(c.name for c in self.core_classes)})")

    def class_of(self, core_id):
        for c in self.core_classes:
            if core_id in c.ids:
                return c
        raise KeyError(f"target '{self.name}' has no core {core_id} (cores: {list(self.core_ids)})")

    def to_dict(self):
        """The description in the file format (features always listed)."""
        return {"name": self.name, "description": self.description, "triple": self.triple, "cpu": self.cpu,
                "features": list(self.features),
                "core_classes": [{"name": c.name, "ids": list(c.ids), "relative_speed": c.relative_speed,
                                  "freq_mhz": c.freq_mhz, "scale": c.scale._asdict()} for c in self.core_classes],
                "caches": self.caches._asdict(), "storage": self.storage._asdict(),
                "gpu": self.gpu._asdict() if self.gpu else None, "modeled": self.modeled, "source": self.source}

    def fingerprint(self):
        """Short stable key for cost tables: ISA (triple, cpu, features) and core topology with scales."""
        d = self.to_dict()
        key = {k: d[k] for k in ("triple", "cpu", "features", "core_classes")}
        if self.blocks_of is not None:
            key["blocks_of"] = self.blocks_of._asdict()
        key = json.dumps(key, sort_keys=True)
        return hashlib.sha256(key.encode()).hexdigest()[:16]


MAX_TASKS = 4  # tasks per execution thread a parallel loop is cut into, at most on average


def task_shares(speeds):
    """How the runtime splits a parallel loop across execution threads of
    these relative speeds (papers/asymo-asymmetric-cpus.txt): thread k runs
    shares[k] consecutive tasks of sum(shares), so its part of the loop
    follows its speed. Of the splits with the slowest thread at 1..8 tasks
    and at most MAX_TASKS tasks per thread in all (a loop of few iterations
    cut finer splits worse), the one with the fewest tasks among those
    within 1 % of the best predicted time (split_factor); [1] * n on
    symmetric cores, where the split is even."""
    n, low = len(speeds), min(speeds)
    if max(speeds) - low <= 0.02 * max(speeds):
        return [1] * n
    splits = [[1] * n]
    for units in range(1, 9):
        shares = [max(1, round(units * s / low)) for s in speeds]
        if sum(shares) <= MAX_TASKS * n:
            splits.append(shares)
    best = min(split_factor(speeds, sh) for sh in splits)
    return min((sh for sh in splits if split_factor(speeds, sh) <= best * 1.01), key=sum)


def split_factor(speeds, shares):
    """A parallel loop's time on threads of these speeds split by `shares`,
    relative to the same loop split evenly over as many threads of speed
    1.0: the slowest thread's part over its speed (tasks of equal cost)."""
    n, total = len(speeds), sum(shares)
    return max(n * sh / total / s for sh, s in zip(shares, speeds))


# LLVM's name (tvm.target.codegen.llvm_get_cpu_features) of each checked
# feature whose coldbrew name differs; the others are spelled alike (x86's
# all, aarch64's neon, dotprod, rdm, lse, crc, rcpc, i8mm, bf16, sve, sve2,
# aes, sha2, sha3). LLVM lists implied features too (cortex-a76: fullfp16
# with dotprod, rdm, lse, rcpc, crc, aes, sha2), and its aes and sha2 are
# what runtime/src/bundle/target.c checks as aes (+PMULL) and sha2 (+SHA1).
LLVM_NAMES = {"aarch64": {"fp16": "fullfp16", "fhm": "fp16fml", "fcma": "complxnum"}}


# Features a host may have beyond what LLVM's name for its cpu implies (a
# virtual machine's CPU model can name an older core): asked of the kernel
# (/proc/cpuinfo's flags, spelled with "_"), and passed to LLVM explicitly.
EXPLICIT_FEATURES = ("amx-tile", "amx-int8")


def _cpuinfo_features(path="/proc/cpuinfo"):
    """The EXPLICIT_FEATURES /proc/cpuinfo lists (none where it cannot be read)."""
    flags = set()
    for line in (_read(path) or "").splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    return tuple(f for f in EXPLICIT_FEATURES if f.replace("-", "_") in flags)


def _features_of(triple, cpu):
    """The checked features LLVM enables for `triple` and `cpu`, in CHECKED_FEATURES order."""
    import tvm
    from tvm.target import codegen

    arch = triple.split("-")[0]
    have = {str(f) for f in codegen.llvm_get_cpu_features(tvm.target.Target({"kind": "llvm", "mtriple": triple, "mcpu": cpu}))}
    if arch == "aarch64":
        have.add("neon")  # Advanced SIMD is part of the base ISA (LLVM lists it for every cpu)
    llvm = LLVM_NAMES.get(arch, {})
    return tuple(f for f in CHECKED_FEATURES.get(arch, []) if llvm.get(f, f) in have)


def _union(arch, *lists):
    """The features in any of `lists`, in CHECKED_FEATURES order."""
    have = {f for fs in lists for f in fs}
    return tuple(f for f in CHECKED_FEATURES[arch] if f in have)


def _target(d, features):
    classes = tuple(CoreClass(c["name"], tuple(c["ids"]), c["relative_speed"], c["freq_mhz"], Scale(**c["scale"]))
                    for c in d["core_classes"])
    return Target(d["name"], d["triple"], d["cpu"], tuple(features), d["description"], classes,
                  Caches(**d["caches"]), Storage(**d["storage"]), Gpu(**d["gpu"]) if d["gpu"] else None,
                  d["modeled"], d["source"])


def load(path):
    """Read and check one target file. Its features are those it lists and
    those LLVM derives from triple and cpu, together: the code is compiled
    for the cpu, so a file cannot record fewer than the code may use."""
    try:
        with open(path) as f:
            desc = json.load(f)
    except (OSError, ValueError) as e:
        raise TargetError(f"{path}: cannot read target file: {e}") from None
    d = validate(desc, path)
    stem = os.path.splitext(os.path.basename(path))[0]
    if d["name"] != stem:
        raise TargetError(f"{path}: 'name' is '{d['name']}' but the file is named '{stem}.json'")
    arch = d["triple"].split("-")[0]
    return _target(d, _union(arch, d.get("features", ()), _features_of(d["triple"], d["cpu"])))


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _host_classes(ids, sysfs=SYSFS_CPU):
    """Usable cores grouped by max frequency, fastest first; one class "core" without cpufreq.
    Host classes all have scale 1.0: host costs are measured, not modeled."""
    mhz = {}
    for i in ids:
        khz = _read(f"{sysfs}/cpu{i}/cpufreq/cpuinfo_max_freq")
        if not (khz and khz.isdigit()):
            return [{"name": "core", "ids": list(ids), "relative_speed": 1.0, "freq_mhz": None,
                     "scale": dict.fromkeys(PHASES, 1.0)}]
        mhz[i] = int(khz) // 1000
    groups = sorted(set(mhz.values()), reverse=True)
    return [{"name": "core" if len(groups) == 1 else f"{f}mhz", "ids": [i for i in ids if mhz[i] == f],
             "relative_speed": round(f / groups[0], 2), "freq_mhz": f, "scale": dict.fromkeys(PHASES, 1.0)}
            for f in groups]


def _host_caches(cpu_id, sysfs=SYSFS_CPU):
    """Data/unified cache sizes of one core from sysfs (nominal 32/256/0 KB where absent)."""
    kb = {}
    for d in glob.glob(f"{sysfs}/cpu{cpu_id}/cache/index*"):
        level, kind, size = (_read(f"{d}/{n}") for n in ("level", "type", "size"))
        if level and size and kind != "Instruction":
            unit = {"K": 1, "M": 1024, "G": 1 << 20}.get(size[-1])  # sysfs writes "48K", "2M"
            kb[int(level)] = int(size[:-1]) * unit if unit else int(size) // 1024
    return {"l1d_kb": kb.get(1, 32), "l2_kb": kb.get(2, 256), "l3_kb": kb.get(3, 0)}


def _host():
    from tvm.target import codegen

    arch = platform.machine()
    if arch not in CHECKED_FEATURES:
        raise TargetError(f"host architecture {arch} is not supported")
    triple = f"{arch}-linux-gnu"
    cpu = codegen.llvm_get_system_cpu()
    ids = sorted(os.sched_getaffinity(0))
    classes = _host_classes(ids)
    desc = {"name": "host", "description": f"this machine ({cpu}, {len(ids)} usable cores)", "triple": triple,
            "cpu": cpu, "core_classes": classes, "caches": _host_caches(classes[0]["ids"][0]),
            "storage": dict(HOST_STORAGE), "gpu": None, "modeled": False,
            "source": "detected: LLVM host CPU, sched_getaffinity, /sys/devices/system/cpu (cpufreq, cache); "
                      "storage nominal until measured"}
    features = _features_of(triple, cpu) + (_cpuinfo_features() if arch == "x86_64" else ())
    return _target(validate(desc, "host"), _union(arch, features))


def available():
    names = sorted(f[:-5] for f in os.listdir(HERE) if f.endswith(".json"))
    return ["host"] + names


GENERIC_VULKAN = Gpu("vulkan", "any Vulkan 1.1 compute device", "discrete", 1)


def _on_gpu(base, name):
    """`base` with its layers executed on its GPU (Vulkan)."""
    import dataclasses

    gpu = base.gpu or (GENERIC_VULKAN if base.name == "host" else None)
    if gpu is None or gpu.api != "vulkan":
        raise TargetError(f"target '{base.name}' has no Vulkan GPU (targets with one: vulkan, "
                          f"{', '.join(n + '+vulkan' for n in available() if n != 'host' and resolve(n).gpu)})")
    return dataclasses.replace(base, name=name, gpu=gpu, executes_on="gpu",
                               description=f"{base.description}; layers on {gpu.name} (Vulkan)")


@functools.lru_cache(maxsize=None)
def resolve(name="host"):
    """The Target called `name`, checked; cached per process. "host" or a file
    in targets/ run on the CPU; "vulkan" (this machine's CPU with any Vulkan
    device) and "<preset>+vulkan" (a preset with a Vulkan GPU, e.g.
    jetson_nano+vulkan) run the layers on the GPU."""
    if name == "host":
        return _host()
    if name == "vulkan":
        return _on_gpu(_host(), name)
    if name.endswith("+vulkan"):
        return _on_gpu(resolve(name[:-len("+vulkan")]), name)
    path = os.path.join(HERE, f"{name}.json")
    if not os.path.exists(path):
        raise TargetError(f"unknown target '{name}' (known: {', '.join(available())})")
    return load(path)
