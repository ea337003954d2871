"""coldbrew's GLSL compute emitter: one GPU-lowered TIR kernel -> GLSL 4.50.

The input is a device function as TVM's lowering leaves it for a GPU target
(codegen_spirv runs the passes): flat buffers, `blockIdx` / `threadIdx`
thread launches, local and shared allocations, `tvm_storage_sync` barriers.
Each pointer parameter becomes one storage buffer (set 0, binding = its
position); the launch extents give the workgroup size (`local_size`) and the
grid the runtime dispatches. Vectorization is off in the lowering, so every
expression is scalar.

A grid wider than Vulkan's guaranteed 65535 workgroups per dimension is
folded: the runtime dispatches (x, y) with x * y >= the width and the shader
rebuilds the index (and returns, uniformly for its workgroup, past the end).
"""
import operator
from dataclasses import dataclass

from ..errors import CompileError
from ..ir.anchors import GPU_MAX_BINDINGS

MAX_GROUPS = 65535  # maxComputeWorkGroupCount[*] every Vulkan device supports
TYPES = {"float32": "float", "int32": "int", "int64": "int", "bool": "bool", "uint32": "uint"}
RESERVED_PREFIX = "v_"
# Storage buffers hold tensors as the host lays them out: int64 as (low, high)
# 32-bit words, read as the low word (shaders compute integers in 32 bits)
# and written sign-extended; bool as one byte each, four to a word, written
# with atomics (neighbouring invocations write bytes of one word).
STORAGE = {"int64": "ivec2", "bool": "uint"}

HELPERS = """
int cb_floordiv(int a, int b) { int q = a / b; return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q; }
int cb_floormod(int a, int b) { return a - cb_floordiv(a, b) * b; }
int cb_truncmod(int a, int b) { return a - (a / b) * b; }
float cb_erf(float x) {  // Abramowitz & Stegun 7.1.26, |error| < 1.5e-7
  float t = 1.0 / (1.0 + 0.3275911 * abs(x));
  float y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * exp(-x * x);
  return x < 0.0 ? -y : y;
}
float cb_tanh(float x) { return tanh(clamp(x, -15.0, 15.0)); }
ivec2 cb_wide(int v) { return ivec2(v, v >> 31); }
"""

BINARY = {"Add": "+", "Sub": "-", "Mul": "*", "EQ": "==", "NE": "!=", "LT": "<", "LE": "<=", "GT": ">", "GE": ">=",
          "And": "&&", "Or": "||", "BitwiseAnd": "&", "BitwiseOr": "|", "BitwiseXor": "^", "LShift": "<<",
          "RShift": ">>"}
CALLS = {"exp": "exp", "log": "log", "sqrt": "sqrt", "fabs": "abs", "floor": "floor",
         "ceil": "ceil", "round": "roundEven", "nearbyint": "roundEven", "trunc": "trunc",
         "pow": "pow", "tanh": "cb_tanh", "erf": "cb_erf", "sin": "sin", "cos": "cos",
         "exp2": "exp2", "log2": "log2", "rsqrt": "inversesqrt", "isnan": "isnan",
         "isinf": "isinf", "atan": "atan", "tan": "tan", "sigmoid": None}
COMPARE = {"EQ": operator.eq, "NE": operator.ne, "LT": operator.lt, "LE": operator.le, "GT": operator.gt,
           "GE": operator.ge}
THREADS = {"blockIdx.x": "gl_WorkGroupID.x", "blockIdx.y": "gl_WorkGroupID.y", "blockIdx.z": "gl_WorkGroupID.z",
           "threadIdx.x": "gl_LocalInvocationID.x", "threadIdx.y": "gl_LocalInvocationID.y",
           "threadIdx.z": "gl_LocalInvocationID.z"}


@dataclass
class Shader:
    """One kernel as GLSL: its source, workgroup size, grid and bindings."""
    name: str
    source: str
    local_size: tuple  # (x, y, z)
    grid: tuple  # workgroups to dispatch (x, y, z)
    params: list  # parameter names in binding order


def _op(call):
    """A call's operator without its dialect prefix ("prim.exp" -> "exp")."""
    return call.op.name.split(".", 1)[-1]


def _dt(e):
    """The dtype of a scalar expression, as a string ("int32", "float32", ...)."""
    return str(e.ty)


def _wide(e):
    """An int64 constant outside int32's range, else None. Shaders compute
    int64 in 32 bits (its values lie in int32's range), so a comparison with
    one has a fixed answer: the answer for 0."""
    if type(e).__name__ != "IntImm" or _dt(e) != "int64":
        return None
    v = int(e.value)
    return None if -2**31 <= v < 2**31 else v


def tvm_float(v):
    """The float32 constant of the integer `v` (a wide int64 literal cast to float)."""
    from tvm import tirx

    return tirx.FloatImm("float32", float(v))


def _int_literal(v):
    """A GLSL int literal of `v` taken modulo 2^32 (int64 arithmetic done in
    32 bits: + - * and the bitwise operators agree on the low 32 bits)."""
    v = (v + 2**31) % 2**32 - 2**31
    return "(-2147483647 - 1)" if v == -2**31 else str(v)


def _ty(dtype, what):
    t = TYPES.get(str(dtype))
    if t is None:
        raise CompileError(f"GPU kernel {what}: dtype {dtype} has no GLSL form")
    return t


class _Emitter:
    def __init__(self, func, name):
        self.func, self.name = func, name
        self.names = {}  # Var -> GLSL name
        self.buffers = {}  # data Var -> GLSL array expression
        self.storage = {}  # GLSL name of a storage buffer -> its dtype, where STORAGE packs it
        self.extents = {}  # thread tag -> extent
        self.shared, self.lines = [], []
        self.used_names = set()

    def fresh(self, hint):
        """A GLSL identifier of its own for `hint` (prefixed: TIR names such as
        `input` are GLSL keywords)."""
        base = RESERVED_PREFIX + "".join(c if c.isalnum() else "_" for c in hint)
        name, k = base, 1
        while name in self.used_names:
            name, k = f"{base}_{k}", k + 1
        self.used_names.add(name)
        return name

    def var(self, v):
        if v not in self.names:
            self.names[v] = self.fresh(v.name)
        return self.names[v]

    # expressions
    def expr(self, e):
        k = type(e).__name__
        if k == "IntImm":
            if _dt(e) == "bool":
                return "true" if e.value else "false"
            return _int_literal(int(e.value)) if _dt(e) != "uint32" else f"{int(e.value)}u"
        if k == "FloatImm":
            import numpy as np

            v = np.float32(e.value)
            if np.isinf(v):
                return "uintBitsToFloat(0x7f800000u)" if v > 0 else "uintBitsToFloat(0xff800000u)"
            if np.isnan(v):
                return "uintBitsToFloat(0x7fc00000u)"
            s = repr(float(v))  # the float32 value exactly, as a double literal
            return s if any(c in s for c in ".e") else s + ".0"
        if k == "Var":
            if e in self.names:
                return self.names[e]
            raise CompileError(f"GPU kernel {self.name}: variable '{e.name}' is not bound")
        if k in COMPARE and (_wide(e.a) is not None or _wide(e.b) is not None):
            # a 32-bit value against an int64 constant beyond int32: decided here
            a, b = _wide(e.a), _wide(e.b)
            return "true" if COMPARE[k](0 if a is None else a, 0 if b is None else b) else "false"
        if k in BINARY:
            return f"({self.expr(e.a)} {BINARY[k]} {self.expr(e.b)})"
        if k == "Div":
            return f"({self.expr(e.a)} / {self.expr(e.b)})"
        if k == "Mod":
            return f"cb_truncmod({self.expr(e.a)}, {self.expr(e.b)})" if "int" in _dt(e) \
                else f"mod({self.expr(e.a)}, {self.expr(e.b)})"
        if k == "FloorDiv":
            return f"cb_floordiv({self.expr(e.a)}, {self.expr(e.b)})" if "int" in _dt(e) \
                else f"floor({self.expr(e.a)} / {self.expr(e.b)})"
        if k == "FloorMod":
            return f"cb_floormod({self.expr(e.a)}, {self.expr(e.b)})" if "int" in _dt(e) \
                else f"({self.expr(e.a)} - floor({self.expr(e.a)} / {self.expr(e.b)}) * {self.expr(e.b)})"
        if k in ("Min", "Max"):
            return self.min_max(k, e.a, e.b)
        if k == "Not":
            return f"(!{self.expr(e.a)})"
        if k == "BitwiseNot":
            return f"(~{self.expr(e.a)})"
        if k == "Select":
            return f"({self.expr(e.condition)} ? {self.expr(e.true_value)} : {self.expr(e.false_value)})"
        if k == "Cast":
            if _wide(e.value) is not None and _dt(e) == "float32":
                return self.expr(tvm_float(_wide(e.value)))
            return f"{_ty(_dt(e), self.name)}({self.expr(e.value)})"
        if k in ("BufferLoad", "TensorLoad"):
            return self.load(self.buffer(getattr(e, 'buffer', None) or e.source), self.index(e.indices))
        if k == "Let":
            raise CompileError(f"GPU kernel {self.name}: expression-level let is not supported")
        if k == "Call":
            return self.call(e)
        raise CompileError(f"GPU kernel {self.name}: expression {k} has no GLSL form")

    def min_max(self, k, a, b):
        """min / max; against an int64 constant beyond int32 (an exporter's
        clamp to INT64_MAX) the answer is the 32-bit side where it must be,
        refused where it would be the constant (not representable here)."""
        wa, wb = _wide(a), _wide(b)
        if wa is None and wb is None:
            return f"{k.lower()}({self.expr(a)}, {self.expr(b)})"
        w, other = (wa, b) if wa is not None else (wb, a)
        if (k == "Min") == (w > 0) and (wa is None or wb is None):  # min with a huge constant, max with a hugely negative one
            return self.expr(other)
        raise CompileError(f"GPU kernel {self.name}: {k.lower()} with the int64 constant {w} gives a value beyond "
                           "32 bits, and GPU shaders compute int64 in 32 bits")

    def index(self, indices):
        if len(indices) != 1:
            raise CompileError(f"GPU kernel {self.name}: buffer access is not flat ({len(indices)} indices)")
        return self.expr(indices[0])

    def load(self, name, i):
        kind = self.storage.get(name)
        if kind == "int64":
            return f"{name}[{i}].x"
        if kind == "bool":
            return f"((({name}[({i}) >> 2] >> ((({i}) & 3) * 8)) & 255u) != 0u)"
        return f"{name}[{i}]"

    def store(self, name, i, v):
        kind = self.storage.get(name)
        if kind == "int64":
            return f"{name}[{i}] = cb_wide({v});"
        if kind == "bool":
            return (f"{{ int cb_i = {i}; uint cb_s = uint(cb_i & 3) * 8u; atomicAnd({name}[cb_i >> 2], "
                    f"~(255u << cb_s)); atomicOr({name}[cb_i >> 2], uint({v}) << cb_s); }}")
        return f"{name}[{i}] = {v};"

    def buffer(self, buf):
        if buf in self.buffers:  # declared by a parameter, an allocation or a view
            return self.buffers[buf]
        raise CompileError(f"GPU kernel {self.name}: buffer '{buf.name}' is not declared")

    def call(self, e):
        op = _op(e)
        args = [self.expr(a) if type(a).__name__ != "StringImm" else "" for a in e.args]
        if op in ("call_pure_extern", "call_extern", "call_llvm_pure_intrin"):  # C math: "expf", "tanhf"
            fname = str(e.args[0].value)
            base = fname[:-1] if fname.endswith("f") and fname[:-1] in CALLS else fname
            if CALLS.get(base):
                return f"{CALLS[base]}({', '.join(args[1:])})"
            raise CompileError(f"GPU kernel {self.name}: external function {fname} has no GLSL form")
        if op == "if_then_else":
            return f"({args[0]} ? {args[1]} : {args[2]})"
        if op == "likely":
            return args[0]
        if op == "sigmoid":
            return f"(1.0 / (1.0 + exp(-{args[0]})))"
        if op in ("shift_left", "shift_right"):
            return f"({args[0]} {'<<' if op.endswith('left') else '>>'} {args[1]})"
        if op in ("bitwise_and", "bitwise_or", "bitwise_xor"):
            return f"({args[0]} {dict(and_='&', or_='|', xor='^')[op.split('_')[-1] + '_']} {args[1]})"
        if op in CALLS and CALLS[op]:
            return f"{CALLS[op]}({', '.join(args)})"
        raise CompileError(f"GPU kernel {self.name}: call {op} has no GLSL form")

    # statements
    def emit(self, line, depth):
        self.lines.append("  " * depth + line)

    def stmt(self, s, depth):
        k = type(s).__name__
        if k == "SeqStmt":
            for x in s:
                self.stmt(x, depth)
        elif k == "AttrStmt":
            if s.attr_key == "thread_extent":
                tag = s.node.thread_tag
                extent = int(s.value)
                if tag not in THREADS:
                    raise CompileError(f"GPU kernel {self.name}: thread binding {tag} is not supported")
                if self.extents.setdefault(tag, extent) != extent:
                    raise CompileError(f"GPU kernel {self.name}: {tag} launched with two extents")
                v = self.var(s.node.var)
                src = "cb_group_x" if tag == "blockIdx.x" else f"int({THREADS[tag]})"
                self.emit(f"int {v} = {src};", depth)
            self.stmt(s.body, depth)
        elif k == "Bind":
            self.emit(f"{_ty(_dt(s.var), self.name)} {self.var(s.var)} = {self.expr(s.value)};", depth)
        elif k == "For":
            v = self.var(s.loop_var)
            lo, n = self.expr(s.min), self.expr(s.extent)
            step = self.expr(s.step) if getattr(s, "step", None) is not None else "1"
            self.emit(f"for (int {v} = {lo}; {v} < {lo} + {n}; {v} += {step}) {{", depth)
            self.stmt(s.body, depth + 1)
            self.emit("}", depth)
        elif k == "While":
            self.emit(f"while ({self.expr(s.condition)}) {{", depth)
            self.stmt(s.body, depth + 1)
            self.emit("}", depth)
        elif k == "IfThenElse":
            self.emit(f"if ({self.expr(s.condition)}) {{", depth)
            self.stmt(s.then_case, depth + 1)
            if s.else_case is not None:
                self.emit("} else {", depth)
                self.stmt(s.else_case, depth + 1)
            self.emit("}", depth)
        elif k == "BufferStore":
            self.emit(self.store(self.buffer(s.buffer), self.index(s.indices), self.expr(s.value)), depth)
        elif k == "AllocBuffer":
            self.alloc(s.buffer, depth)
        elif k == "DeclBuffer":  # a view of a parameter, or of an allocation (buffer_data(buf))
            src = s.data
            if type(src).__name__ == "Call" and _op(src) == "buffer_data":
                src = src.args[0]
            if src is None or src not in self.buffers:
                raise CompileError(f"GPU kernel {self.name}: buffer '{s.buffer.name}' views unknown memory")
            if int(getattr(s.buffer, "elem_offset", 0) or 0):
                raise CompileError(f"GPU kernel {self.name}: buffer '{s.buffer.name}' is an offset view")
            self.buffers[s.buffer] = self.buffers[src]
        elif k == "Evaluate":
            e = s.value
            if type(e).__name__ == "Call" and _op(e) == "tvm_storage_sync":
                self.emit("memoryBarrierShared(); barrier();", depth)
            elif type(e).__name__ == "Call":
                self.emit(f"{self.call(e)};", depth)
        elif k == "AssertStmt":
            pass  # shapes are static: the host side checked them at compile time
        else:
            raise CompileError(f"GPU kernel {self.name}: statement {k} has no GLSL form")

    def alloc(self, buf, depth):
        scope = buf.scope()
        n = 1
        for d in buf.shape:
            n *= int(d)
        name = self.fresh(buf.name)
        ty = _ty(buf.dtype, self.name)
        if scope == "shared":
            self.shared.append(f"shared {ty} {name}[{n}];")
        elif scope in ("local", ""):
            self.emit(f"{ty} {name}[{n}];", depth)
        else:
            raise CompileError(f"GPU kernel {self.name}: memory scope '{scope}' is not supported")
        self.buffers[buf] = name

    def run(self):
        f = self.func
        params = []
        decls = []
        for i, p in enumerate(f.params):
            ty = p.ty
            elem = getattr(ty, "element_type", None)
            if elem is None:
                raise CompileError(f"GPU kernel {self.name}: scalar parameter '{p.name}' is not supported")
            dtype = str(elem.dtype)
            name = self.var(p)
            ty = STORAGE.get(dtype) or _ty(dtype, self.name)
            decls.append(f"layout(std430, set = 0, binding = {i}) buffer B{i} {{ {ty} {name}[]; }};")
            if dtype in STORAGE:
                self.storage[name] = dtype
            self.buffers[p] = name
            params.append(p.name)
        self.stmt(f.body, 1)
        x, y, z = (self.extents.get(f"threadIdx.{a}", 1) for a in "xyz")
        gx, gy, gz = (self.extents.get(f"blockIdx.{a}", 1) for a in "xyz")
        fold = ""
        if gx > MAX_GROUPS:
            if gy > 1 or gz > 1:
                raise CompileError(f"GPU kernel {self.name}: grid {gx}x{gy}x{gz} exceeds {MAX_GROUPS} per dimension")
            gy = -(-gx // MAX_GROUPS)
            fold = (f"  int cb_group_x = int(gl_WorkGroupID.x + gl_WorkGroupID.y * {MAX_GROUPS}u);\n"
                    f"  if (cb_group_x >= {gx}) return;\n")
            grid = (MAX_GROUPS, gy, gz)
        else:
            fold = "  int cb_group_x = int(gl_WorkGroupID.x);\n"
            grid = (gx, gy, gz)
        if len(params) > GPU_MAX_BINDINGS:
            raise CompileError(f"GPU kernel {self.name}: binds {len(params)} tensors (at most {GPU_MAX_BINDINGS})")
        if x * y * z > 1024:
            raise CompileError(f"GPU kernel {self.name}: workgroup of {x * y * z} invocations (at most 1024)")
        src = "\n".join(["#version 450",
                         f"layout(local_size_x = {x}, local_size_y = {y}, local_size_z = {z}) in;", *decls,
                         *self.shared, HELPERS, "void main() {", fold.rstrip("\n"), *self.lines, "}", ""])
        return Shader(self.name, src, (x, y, z), grid, params)


def emit(func, name):
    """GLSL for one lowered device function."""
    return _Emitter(func, name).run()
