"""The target file format, checked by hand (no jsonschema dependency).

`validate(desc, where)` returns a normalized copy of a target description
(optional fields filled in) or raises TargetError naming `where` (the file)
and the field. targets/README.md describes the format.
"""

# Features the runtime checks (keep in sync with runtime/src/bundle/target.c).
CHECKED_FEATURES = {
    "x86_64": ["sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl",
               "avx512cd", "avx512vnni", "avx512bf16", "avx512fp16", "bmi", "bmi2", "amx-tile", "amx-int8"],
    # aarch64: Linux AT_HWCAP/AT_HWCAP2 bits; LLVM's names in targets/__init__.py LLVM_NAMES
    "aarch64": ["neon", "fp16", "dotprod", "rdm", "lse", "crc", "rcpc", "fhm", "i8mm", "bf16", "sve", "sve2",
                "aes", "sha2", "sha3", "fcma"],
}
PHASES = ("read", "transform", "execute")
GPU_APIS = ("vulkan",)
GPU_CLASSES = ("integrated", "discrete", "virtual", "cpu")  # Vulkan's VkPhysicalDeviceType names


class TargetError(ValueError):
    pass


def _fail(where, field, problem):
    raise TargetError(f"{where}: '{field}' {problem}")


def _keys(where, field, d, required, optional=()):
    if not isinstance(d, dict):
        _fail(where, field or "(file)", "must be a JSON object")
    for k in required:
        if k not in d:
            _fail(where, f"{field}.{k}" if field else k, "is missing")
    for k in d:
        if k not in required and k not in optional:
            _fail(where, f"{field}.{k}" if field else k, "is not a known field")


def _str(where, field, v):
    if not isinstance(v, str) or not v:
        _fail(where, field, "must be a non-empty string")
    return v


def _num(where, field, v, low=0.0, strict=True):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < low or (strict and v == low):
        _fail(where, field, f"must be a number {'>' if strict else '>='} {low:g} (got {v!r})")
    return v


def _int(where, field, v, low=0):
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        _fail(where, field, f"must be an integer >= {low} (got {v!r})")
    return v


def _bool(where, field, v):
    if not isinstance(v, bool):
        _fail(where, field, f"must be true or false (got {v!r})")
    return v


def _classes(where, classes):
    if not isinstance(classes, list) or not classes:
        _fail(where, "core_classes", "must be a non-empty list")
    out, owner = [], {}
    for i, c in enumerate(classes):
        f = f"core_classes[{i}]"
        _keys(where, f, c, ("name", "ids", "relative_speed", "freq_mhz", "scale"))
        name = _str(where, f"{f}.name", c["name"])
        if any(o["name"] == name for o in out):
            _fail(where, f"{f}.name", f"repeats class name '{name}'")
        if not isinstance(c["ids"], list) or not c["ids"]:
            _fail(where, f"{f}.ids", "must be a non-empty list of core ids")
        for core in c["ids"]:
            _int(where, f"{f}.ids", core)
            if core in owner:
                _fail(where, f"{f}.ids", f"has core {core}, which is already in class '{owner[core]}'")
            owner[core] = name
        speed = _num(where, f"{f}.relative_speed", c["relative_speed"])
        if speed > 1.0 or (i == 0 and speed != 1.0):
            _fail(where, f"{f}.relative_speed", "must be 1.0 for the first (fastest) class and <= 1.0 after it")
        if out and speed > out[-1]["relative_speed"]:
            _fail(where, f"{f}.relative_speed", "is faster than the class before it (order classes fastest first)")
        if c["freq_mhz"] is not None:
            _num(where, f"{f}.freq_mhz", c["freq_mhz"])
        _keys(where, f"{f}.scale", c["scale"], PHASES)
        scale = {p: _num(where, f"{f}.scale.{p}", c["scale"][p]) for p in PHASES}
        out.append({"name": name, "ids": list(c["ids"]), "relative_speed": speed, "freq_mhz": c["freq_mhz"],
                    "scale": scale})
    return out


def validate(desc, where):
    """Check a target description; return it with optional fields filled in."""
    _keys(where, "", desc, ("name", "description", "triple", "cpu", "core_classes", "caches", "storage", "modeled",
                            "source"), ("features", "gpu"))
    d = {k: _str(where, k, desc[k]) for k in ("name", "description", "triple", "cpu", "source")}
    arch = d["triple"].split("-")[0]
    if arch not in CHECKED_FEATURES:
        _fail(where, "triple", f"has architecture '{arch}'; known: {', '.join(CHECKED_FEATURES)}")
    d["modeled"] = _bool(where, "modeled", desc["modeled"])
    if "features" in desc:
        if not isinstance(desc["features"], list):
            _fail(where, "features", "must be a list of strings")
        for f in desc["features"]:
            if f not in CHECKED_FEATURES[arch]:
                _fail(where, "features", f"has '{f}', which the runtime does not check for {arch} "
                                         f"(known: {', '.join(CHECKED_FEATURES[arch])})")
        d["features"] = list(desc["features"])
    elif d["modeled"]:
        _fail(where, "features", "is missing: modeled targets must list them (a bundle records them and the ones "
                                 "LLVM derives from the cpu)")
    d["core_classes"] = _classes(where, desc["core_classes"])
    c = desc["caches"]
    _keys(where, "caches", c, ("l1d_kb", "l2_kb"), ("l3_kb",))
    d["caches"] = {"l1d_kb": _int(where, "caches.l1d_kb", c["l1d_kb"], 1),
                   "l2_kb": _int(where, "caches.l2_kb", c["l2_kb"], 1),
                   "l3_kb": _int(where, "caches.l3_kb", c.get("l3_kb", 0))}
    s = desc["storage"]
    _keys(where, "storage", s, ("read_mb_s", "latency_us"), ("measured",))
    d["storage"] = {"read_mb_s": _num(where, "storage.read_mb_s", s["read_mb_s"]),
                    "latency_us": _num(where, "storage.latency_us", s["latency_us"], strict=False),
                    "measured": _bool(where, "storage.measured", s.get("measured", False))}
    g = desc.get("gpu")
    if g is not None:
        _keys(where, "gpu", g, ("api", "name", "device_class", "compute_units"))
        if g["api"] not in GPU_APIS:
            _fail(where, "gpu.api", f"must be one of {', '.join(GPU_APIS)} (got {g['api']!r})")
        if g["device_class"] not in GPU_CLASSES:
            _fail(where, "gpu.device_class", f"must be one of {', '.join(GPU_CLASSES)} (got {g['device_class']!r})")
        g = {"api": g["api"], "name": _str(where, "gpu.name", g["name"]), "device_class": g["device_class"],
             "compute_units": _int(where, "gpu.compute_units", g["compute_units"], 1)}
    d["gpu"] = g
    return d
