"""Which pipelines hold up a GPU bundle's first-ever launch: each shader's
pipeline made with no cache (the driver's disk cache off), one at a time
and all at once on 16 threads, after the context (loader, instance,
device), by bench/experiments/vk_pipelines.c. Two steps, the second on the
GPU machine (it needs the Vulkan loader, no coldbrew):

    python bench/experiments/vk_pipelines.py extract DIR [models...]   # here: Vulkan bundles' shaders
    python bench/experiments/vk_pipelines.py run DIR [--rounds 3]       # there

`extract` compiles each model (zoo names or corpus:NAME) for the vulkan
target and writes its shaders as DIR/<model>/<k>_<name>.spv with a list of
their binding counts, and builds the probe as DIR/vk_pipelines (gcc and the
Vulkan headers, which a GPU machine may lack); `run` prints, per model and shader, the median time
to make its pipeline alone (in shader order, one thread) and among all (16
threads), and the context's parts. Medians over rounds, milliseconds.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/: harness

HERE = os.path.dirname(os.path.abspath(__file__))


def extract(out, models):
    from harness.common import model_source

    from coldbrew.compiler import compile_model
    from coldbrew.compiler.bundle.reader import read_bytes, text
    from coldbrew.schemas.generated import bundle_generated as fb

    for name in models:
        model, shapes, binds = model_source(name)
        data = compile_model(model, target="vulkan", input_shapes=shapes, constants=binds)
        b = read_bytes(data)[0]
        seg = next(s for s in b.segments if s.kind == fb.SegmentKind.spirv)
        folder = os.path.join(out, name.replace(":", "_"))
        os.makedirs(folder, exist_ok=True)
        listed = []
        for k, sh in enumerate(b.shaders):
            file = f"{k:02d}_{text(sh.name).replace('/', '_')[:40]}.spv"
            with open(os.path.join(folder, file), "wb") as f:
                f.write(data[seg.offset + sh.offset:seg.offset + sh.offset + sh.size])
            listed.append(f"{file}:{sh.bindings}")
        with open(os.path.join(folder, "shaders.txt"), "w") as f:
            f.write("\n".join(listed) + "\n")
        print(f"{name}: {len(b.shaders)} shaders", flush=True)
    subprocess.run(["gcc", "-O2", "-o", os.path.join(out, "vk_pipelines"), os.path.join(HERE, "vk_pipelines.c"),
                    "-ldl", "-lpthread"], check=True)


def probe(exe, folder, threads):
    with open(os.path.join(folder, "shaders.txt")) as f:
        args = [os.path.join(folder, line.strip()) for line in f if line.strip()]
    env = dict(os.environ, __GL_SHADER_DISK_CACHE="0", MESA_SHADER_CACHE_DISABLE="true")
    r = subprocess.run([exe, str(threads), *args], capture_output=True, text=True, env=env, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def run(out, rounds):
    exe = os.path.join(out, "vk_pipelines")
    models = sorted(d for d in os.listdir(out) if os.path.exists(os.path.join(out, d, "shaders.txt")))
    res = {m: {"alone": [], "all": []} for m in models}
    for _ in range(rounds):  # rounds: every model, both ways, once each
        for m in models:
            res[m]["alone"].append(probe(exe, os.path.join(out, m), 1))
            res[m]["all"].append(probe(exe, os.path.join(out, m), 16))
    first = res[models[0]]["alone"][0]
    print(f"{first['device']}; medians of {rounds} rounds, ms; fresh process each")
    for m in models:
        runs = res[m]["alone"] + res[m]["all"]
        ctx = {k: statistics.median(r[k] for r in runs) for k in ("instance", "device_create")}
        walls = {k: statistics.median(r["pipelines_wall"] for r in res[m][k]) for k in ("alone", "all")}
        print(f"\n{m}: instance {ctx['instance']:.0f}, device {ctx['device_create']:.0f}; pipelines one at a time "
              f"{walls['alone']:.0f} in all, all at once on 16 threads {walls['all']:.0f}")
        print(f"  {'shader':<48} {'bytes':>7} {'alone':>7} {'among all':>10}")
        for k, sh in enumerate(res[m]["alone"][0]["shaders"]):
            alone = statistics.median(r["shaders"][k]["ms"] for r in res[m]["alone"])
            among = statistics.median(r["shaders"][k]["ms"] for r in res[m]["all"])
            print(f"  {os.path.basename(sh['path']):<48} {sh['bytes']:>7} {alone:>7.1f} {among:>10.1f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["extract", "run"])
    ap.add_argument("dir")
    ap.add_argument("models", nargs="*", default=["squeezenet", "mobilenet_v2", "resnet50"])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if args.mode == "extract":
        extract(args.dir, args.models)
    else:
        run(args.dir, args.rounds)


if __name__ == "__main__":
    main()
