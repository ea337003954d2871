"""Target descriptions: which CPU a bundle's code is built for.

`host` is detected (LLVM's view of this machine's CPU); other targets are
JSON files in this folder. The features a bundle records are those the
runtime can check on the running CPU (runtime/src/target.c), so a bundle for
another CPU is refused with a message instead of dying on an illegal
instruction.
"""
import json
import os
import platform
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))

# Features the runtime checks (keep in sync with runtime/src/target.c).
CHECKED_FEATURES = {
    "x86_64": ["sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl",
               "avx512cd", "avx512vnni", "avx512bf16", "avx512fp16", "bmi", "bmi2"],
    "aarch64": ["neon"],
}


@dataclass(frozen=True)
class Target:
    name: str
    triple: str
    cpu: str
    features: tuple

    @property
    def arch(self):
        return self.triple.split("-")[0]

    def llvm(self):
        """The TVM target dict for this CPU."""
        return {"kind": "llvm", "mtriple": self.triple, "mcpu": self.cpu}


def _features_of(triple, cpu):
    import tvm
    from tvm.target import codegen

    arch = triple.split("-")[0]
    have = {str(f) for f in codegen.llvm_get_cpu_features(tvm.target.Target({"kind": "llvm", "mtriple": triple, "mcpu": cpu}))}
    if arch == "aarch64":
        have.add("neon")
    return tuple(f for f in CHECKED_FEATURES.get(arch, []) if f in have)


def available():
    names = sorted(f[:-5] for f in os.listdir(HERE) if f.endswith(".json"))
    return ["host"] + names


def resolve(name="host"):
    if name == "host":
        from tvm.target import codegen

        arch = platform.machine()
        if arch not in CHECKED_FEATURES:
            raise ValueError(f"host architecture {arch} is not supported")
        triple = f"{arch}-linux-gnu"
        cpu = codegen.llvm_get_system_cpu()
        return Target("host", triple, cpu, _features_of(triple, cpu))
    path = os.path.join(HERE, f"{name}.json")
    if not os.path.exists(path):
        raise ValueError(f"unknown target '{name}' (known: {', '.join(available())})")
    with open(path) as f:
        desc = json.load(f)
    return Target(name, desc["triple"], desc["cpu"], _features_of(desc["triple"], desc["cpu"]))
