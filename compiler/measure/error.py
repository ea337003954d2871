"""What narrow weights (fp16, int8) do to a model's outputs, measured, and
which layers keep fp32 under a bound (`coldbrew compile --weights-precision
P --max-error E`).

The yardstick is a *probe*: the model compiled once for this machine (its
default variants, whatever the bundle's target and plan: weights narrowed
the same way give the same widened values everywhere) with fp32 raw
weights. Its reference outputs use the original weights; a probe of
a precision assignment writes the same graph and code with each narrowed
layer's raw weights replaced by exactly what the bundle's transform will
compute from the narrow ones (compiler/narrow.narrow_weights), and runs
it with coldbrew's runtime on the sample inputs. No code is generated per
probe, so every layer can be measured alone:

- per layer: the model's output error with only that layer narrowed;
- whole model: the error with every chosen layer narrowed.

Error of one output: max |y' - y| / max |y| (relative to the output's peak),
the maximum over outputs and samples; also whether the first output's
argmax (top-1 of a classifier) stays the same on every sample.

With a bound, layers are kept fp32 in order of their own error, largest
first, the fewest that bring the whole model under the bound (a binary
search over that order, each step measured).
"""
import dataclasses
import os
from collections import namedtuple

import numpy as np

from ..errors import CompileError

SAMPLES = 4  # generated sample inputs
SEED = 0
Input = namedtuple("Input", "name dtype shape")


def sample_inputs(infos, calibration=None, samples=SAMPLES, seed=SEED):
    """([{input name: array}], description). `infos`: the probe's input
    metadata (name, dtype, shape). `calibration`: a .npz path or a dict of
    arrays, each shaped like its input or with a leading sample axis."""
    if calibration is None:
        rng = np.random.default_rng(seed)
        feeds = []
        for _ in range(samples):
            feed = {}
            for i in infos:
                if np.issubdtype(i.dtype, np.floating):
                    feed[i.name] = rng.standard_normal(i.shape).astype(i.dtype)
                else:  # indices, lengths, masks: zeros are valid for any of them
                    feed[i.name] = np.zeros(i.shape, i.dtype)
            feeds.append(feed)
        return feeds, f"generated ({samples} samples, normal, seed {seed})"
    name = os.path.basename(calibration) if isinstance(calibration, str) else "calibration arrays"
    try:
        data = dict(np.load(calibration)) if isinstance(calibration, str) else dict(calibration)
    except (OSError, ValueError) as e:
        raise CompileError(f"calibration data {name}: {e}") from None
    missing = [i.name for i in infos if i.name not in data]
    if missing:
        raise CompileError(f"calibration data {name} lacks input(s) {missing}; it has {sorted(data)}")
    count = None
    for i in infos:
        a = np.asarray(data[i.name])
        if list(a.shape) == list(i.shape):
            a = a[None]
        if list(a.shape[1:]) != list(i.shape):
            raise CompileError(f"calibration data {name}: input '{i.name}' has shape {list(a.shape)}; "
                               f"expected {list(i.shape)} or [samples, {', '.join(map(str, i.shape))}]")
        if count is not None and a.shape[0] != count:
            raise CompileError(f"calibration data {name}: inputs have different sample counts")
        count, data[i.name] = a.shape[0], a.astype(i.dtype)
    if not count:
        raise CompileError(f"calibration data {name} holds no samples")
    return [{i.name: data[i.name][k] for i in infos} for k in range(count)], f"{name} ({count} samples)"


def output_error(reference, outputs):
    """(max relative error, top-1 agreement fraction) of `outputs` against
    `reference` (lists over samples of lists over outputs)."""
    err, agree = 0.0, 0
    for ref, got in zip(reference, outputs):
        for r, g in zip(ref, got):
            r64, g64 = r.astype(np.float64), g.astype(np.float64)
            peak = float(np.max(np.abs(r64))) if r64.size else 0.0
            diff = float(np.max(np.abs(g64 - r64))) if r64.size else 0.0
            if not np.all(np.isfinite(g64)):
                diff = float("inf")
            err = max(err, diff / peak if peak > 0 else diff)
        agree += int(ref[0].size == 0 or np.argmax(ref[0]) == np.argmax(got[0]))
    return err, agree / max(1, len(reference))


class Probe:
    """The model compiled for this machine with fp32 raw weights; runs it
    with the weights of any precision assignment."""

    def __init__(self, front):
        from ..options import Choices
        from ..passes import codegen
        from ..pipeline import lower, version
        from ..kernels.build import output_axis
        from ..passes.plan_weights import generic_narrowable

        host = dataclasses.replace(front, options=dataclasses.replace(front.options, target="host"))
        self.target = host.target
        self.graph = lower(host, Choices(weights="raw", threads=1))
        self.code = codegen.apply(self.graph, self.target)
        self.producer, self.model_hash = f"coldbrew {version()}", front.model_hash
        self.layers = {}  # key (anchor id, or a generic layer's name) -> [(tensor, fp32 data, axis)]
        for layer in self.graph.layers:
            a = next((self.graph.tensors[i].anchor for i in layer.args if self.graph.tensors[i].anchor), None)
            if a is None:
                continue
            raw = layer.transform_args[0] if layer.transform else next(
                i for i in layer.args if self.graph.tensors[i].anchor is a)
            t = self.graph.tensors[raw]
            self.layers[a.id] = [(t, np.array(t.data, np.float32), output_axis(a.spec))]
        # weights of layers without a variant (fp16 only, compiler/passes/plan_weights.py)
        self.generic = {name: [(self.graph.tensors[i], np.array(self.graph.tensors[i].data, np.float32), 0)
                               for i in ids] for name, ids in generic_narrowable(self.graph).items()}

    def infos(self):
        """The model's inputs: name, dtype, shape (as the runtime reports them)."""
        return [Input(t.name, np.dtype(t.dtype), list(t.shape)) for t in (self.graph.tensors[i] for i in self.graph.inputs)]

    def _session(self):
        from coldbrew.runtime import load

        from ..passes import write_bundle

        data = write_bundle.apply(self.graph, self.code, self.target, self.producer, self.model_hash)
        return load(data, threads=1)

    def run(self, feeds, precisions):
        """Outputs per sample with the layers of `precisions` ({anchor id:
        precision}) narrowed."""
        from ..ir.narrow import narrow_weights

        every = list(self.layers.items()) + list(self.generic.items())
        for key, entries in every:
            p = precisions.get(key, "fp32")
            for t, raw, axis in entries:
                t.data = raw if p == "fp32" else narrow_weights(raw, p, axis)[1]
        try:
            with self._session() as s:
                return [s.run(None, f) for f in feeds]
        finally:
            for _, entries in every:
                for t, raw, _ in entries:
                    t.data = raw


def choose(front, precision, max_error=None, calibration=None, only=None, samples=SAMPLES):
    """({anchor id: precision}, {anchor id: solo output error}, accuracy dict)
    for narrowing every variant layer's weights (or those in `only`) to
    `precision` ("fp16", "int8"), or the fewest kept fp32 under
    `max_error`. Layers whose weights exceed the fp16 range stay fp32
    (compiler/passes/plan_weights.py)."""
    from ..ir.narrow import fits_fp16

    probe = Probe(front)
    feeds, described = sample_inputs(probe.infos(), calibration, samples)
    reference = probe.run(feeds, {})
    ids = [aid for aid, [(_, raw, _)] in probe.layers.items() if (only is None or aid in only)
           and (precision != "fp16" or fits_fp16(raw))]
    if precision == "fp16" and only is None:  # a plan narrows only the variant layers it chose
        ids += list(probe.generic)
    solo = {aid: output_error(reference, probe.run(feeds, {aid: precision}))[0] for aid in ids}

    def measured(keep):
        chosen = {aid: precision for aid in ids if aid not in keep}
        return chosen, output_error(reference, probe.run(feeds, chosen))

    chosen, (err, top1) = measured(set())
    if max_error is not None and err > max_error:
        order = sorted(ids, key=lambda aid: -solo[aid])
        lo, hi = 1, len(order)  # keeping all of them fp32 meets any bound
        best = ({}, (0.0, 1.0))
        while lo <= hi:
            mid = (lo + hi) // 2
            trial = measured(set(order[:mid]))
            if trial[1][0] <= max_error:
                best, hi = trial, mid - 1
            else:
                lo = mid + 1
        chosen, (err, top1) = best
    accuracy = {"output_error": err, "samples": len(feeds), "inputs": described, "max_error": max_error,
                "top1_agree": top1}
    return chosen, solo, accuracy
