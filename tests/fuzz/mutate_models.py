"""The compiler on bad input: seeded mutations of zoo ONNX models, each
compiled in a forked child with a time limit. A case passes when it ends in
a bundle or in a CompileError with a message; a traceback of any other
exception, a crash of the process or a hang fails it.

    python tests/fuzz/mutate_models.py [--cases 1000] [--models squeezenet,...] [--seed 0] [--timeout 300]

Mutations (MUTATORS): input shapes (zero, negative, huge, wrong rank),
element types (of inputs and initializers, including invalid numbers),
attributes (values, types, removed, unknown), dangling tensor names,
cycles, duplicated outputs, swapped or dropped node inputs, unknown
operators and domains, opsets, initializers whose bytes do not match their
shape, removed outputs, and raw protobuf bytes (flipped, truncated). The
full run prints a line per case that did not pass and a summary; exit 1 on
any. tests/compiler/test_mutations.py runs a fixed subset in CI.
"""
import argparse
import multiprocessing as mp
import os
import random
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DEFAULT_MODELS = ("squeezenet", "shufflenet_v2", "mobilenet_v2", "crnn", "resnet18")


def _node_with(model, rng, pred):
    nodes = [n for n in model.graph.node if pred(n)]
    return rng.choice(nodes) if nodes else None


def m_input_shape(model, rng):
    i = model.graph.input[0]
    dims = i.type.tensor_type.shape.dim
    how = rng.choice(["zero", "negative", "huge", "rank+", "rank-", "symbolic"])
    if how == "rank+":
        dims.add().dim_value = rng.choice([1, 3])
    elif how == "rank-" and len(dims):
        del dims[-1]
    elif len(dims):
        d = dims[rng.randrange(len(dims))]
        if how == "symbolic":
            d.dim_param = "n"
        else:
            d.dim_value = {"zero": 0, "negative": -3, "huge": 1 << 40}[how]
    return f"input shape {how}"


def m_dtype(model, rng):
    if rng.random() < 0.5 and model.graph.initializer:
        t = rng.choice(model.graph.initializer)
        t.data_type = rng.choice([0, 2, 3, 6, 7, 8, 9, 10, 11, 99])
        return f"initializer {t.name} dtype {t.data_type}"
    i = model.graph.input[0]
    i.type.tensor_type.elem_type = rng.choice([0, 2, 6, 7, 8, 9, 10, 11, 16, 99])
    return f"input dtype {i.type.tensor_type.elem_type}"


def m_attribute(model, rng):
    from onnx import helper

    node = _node_with(model, rng, lambda n: len(n.attribute) > 0)
    if node is None:
        return "no attributes"
    a = node.attribute[rng.randrange(len(node.attribute))]
    how = rng.choice(["value", "type", "remove", "unknown"])
    if how == "remove":
        node.attribute.remove(a)
    elif how == "unknown":
        node.attribute.append(helper.make_attribute("no_such_attribute", 3))
    elif how == "type":
        name = a.name
        node.attribute.remove(a)
        node.attribute.append(helper.make_attribute(name, rng.choice([1.5, "text", [1.0, 2.0]])))
    elif a.ints:
        a.ints[rng.randrange(len(a.ints))] = rng.choice([0, -1, -7, 1 << 31, 99])
    elif a.type == a.INT:
        a.i = rng.choice([0, -1, -5, 1 << 40, 7])
    elif a.type == a.FLOAT:
        a.f = rng.choice([float("nan"), float("inf"), -1.0, 0.0])
    else:
        a.s = b"nonsense"
    return f"attribute {a.name} of {node.name}: {how}"


def m_dangling(model, rng):
    node = _node_with(model, rng, lambda n: len(n.input) > 0)
    k = rng.randrange(len(node.input))
    node.input[k] = "no_such_tensor"
    return f"{node.name} input {k} dangling"


def m_cycle(model, rng):
    nodes = model.graph.node
    if len(nodes) < 2:
        return "too small"
    i = rng.randrange(len(nodes) - 1)
    j = rng.randrange(i, len(nodes))
    if not nodes[i].input or not nodes[j].output:
        return "no edge"
    nodes[i].input[0] = nodes[j].output[0]  # a later (or its own) output feeds an earlier node
    return f"cycle {nodes[j].name} -> {nodes[i].name}"


def m_duplicate_output(model, rng):
    nodes = model.graph.node
    a, b = rng.sample(range(len(nodes)), 2)
    nodes[a].output[0] = nodes[b].output[0]
    return f"{nodes[a].name} and {nodes[b].name} write one name"


def m_inputs(model, rng):
    node = _node_with(model, rng, lambda n: len(n.input) > 0)
    how = rng.choice(["drop", "extra", "swap", "empty"])
    if how == "drop":
        del node.input[-1]
    elif how == "extra":
        node.input.append(model.graph.input[0].name)
    elif how == "swap" and len(node.input) > 1:
        node.input[0], node.input[1] = node.input[1], node.input[0]
    else:
        node.input[0] = ""
    return f"{node.name} inputs {how}"


def m_operator(model, rng):
    node = rng.choice(model.graph.node)
    how = rng.choice(["unknown", "domain", "other"])
    if how == "unknown":
        node.op_type = "NoSuchOp"
    elif how == "domain":
        node.domain = "com.example"
    else:
        node.op_type = rng.choice(["Relu", "Conv", "Add", "Reshape", "Softmax", "MatMul", "Concat", "LSTM"])
    return f"{node.name} operator {how} ({node.domain or ''}{node.op_type})"


def m_opset(model, rng):
    model.opset_import[0].version = rng.choice([1, 6, 9, 25, 999])
    if rng.random() < 0.3:
        model.ir_version = rng.choice([0, 1, 99])
    return f"opset {model.opset_import[0].version} ir {model.ir_version}"


def m_initializer(model, rng):
    t = rng.choice(model.graph.initializer)
    how = rng.choice(["truncate", "dims", "empty"])
    if how == "truncate" and t.raw_data:
        t.raw_data = t.raw_data[: len(t.raw_data) // 2]
    elif how == "dims" and len(t.dims):
        t.dims[0] = t.dims[0] * 3 + 1
    else:
        t.ClearField("raw_data")
        del t.float_data[:]
        del t.int64_data[:]
    return f"initializer {t.name} {how}"


def m_outputs(model, rng):
    how = rng.choice(["remove", "dangling"])
    if how == "remove":
        del model.graph.output[:]
    else:
        model.graph.output[0].name = "no_such_output"
    return f"graph output {how}"


def m_bytes(model, rng):
    data = bytearray(model.SerializeToString())
    how = rng.choice(["flip", "truncate", "zero"])
    if how == "truncate":
        data = data[: rng.randrange(len(data))]
    else:
        for _ in range(rng.randint(1, 16)):
            k = rng.randrange(len(data))
            data[k] = 0 if how == "zero" else data[k] ^ (1 << rng.randrange(8))
    return f"protobuf bytes {how}", bytes(data)


MUTATORS = [m_input_shape, m_dtype, m_attribute, m_dangling, m_cycle, m_duplicate_output, m_inputs, m_operator,
            m_opset, m_initializer, m_outputs, m_bytes]


def mutate(model, seed, mutator):
    """(description, model bytes) of `mutator` applied with `seed` to a copy of `model`."""
    import onnx

    rng = random.Random(seed)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    what = mutator(m, rng)
    if isinstance(what, tuple):
        return what
    return what, m.SerializeToString()


def _child(data, conn):
    from coldbrew.compiler import CompileError, compile_model

    try:
        compile_model(data, None, tune=False)
        conn.send(("bundle", ""))
    except CompileError as e:
        conn.send(("compile_error", str(e)))
    except BaseException:  # noqa: B902 - every other exception is what this looks for
        conn.send(("traceback", traceback.format_exc()))
    conn.close()


def run_case(data, timeout):
    """("bundle" | "compile_error" | "traceback" | "crash" | "hang", detail) of compiling `data`."""
    ctx = mp.get_context("fork")  # the parent imported the compiler once; each case is a fork of it
    recv, send = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_child, args=(data, send))
    p.start()
    send.close()
    if not recv.poll(timeout):
        p.kill()
        p.join()
        return "hang", f"no result in {timeout} s"
    try:
        kind, detail = recv.recv()
    except EOFError:
        p.join()
        return "crash", f"the process died (exit {p.exitcode})"
    p.join()
    if kind == "compile_error" and not detail.strip():
        return "traceback", "CompileError without a message"
    return kind, detail


def run(models, cases, seed=0, timeout=300, report=print):
    """Compile `cases` mutations, every mutator in turn over every model;
    {outcome: count} and the failing cases."""
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import zoo

    import coldbrew.compiler

    coldbrew.compiler.PASSES  # noqa: B018  every pass imported once, before the forks: each case runs this code

    protos = {m: zoo.build(m) for m in models}
    counts, failures = {}, []
    for k in range(cases):
        name = models[k % len(models)]
        mutator = MUTATORS[k // len(models) % len(MUTATORS)]
        what, data = mutate(protos[name], seed * 1_000_003 + k, mutator)
        t = time.perf_counter()
        kind, detail = run_case(data, timeout)
        counts[kind] = counts.get(kind, 0) + 1
        if kind in ("traceback", "crash", "hang"):
            failures.append((k, name, what, kind, detail))
            report(f"case {k} ({name}: {what}): {kind}\n{detail}")
        else:
            report(f"case {k} ({name}: {what}): {kind} in {time.perf_counter() - t:.1f} s"
                   + (f": {detail.splitlines()[0][:120]}" if detail else ""))
    return counts, failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=int, default=300, help="seconds per case before it counts as a hang")
    args = ap.parse_args()
    t = time.perf_counter()
    counts, failures = run(args.models.split(","), args.cases, args.seed, args.timeout,
                           report=lambda s: print(s, flush=True))
    print(f"{args.cases} mutated models in {(time.perf_counter() - t) / 60:.1f} min: "
          + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
          + f"; {len(failures)} failed (traceback, crash or hang)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
