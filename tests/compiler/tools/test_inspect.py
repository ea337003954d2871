"""compiler/tools/inspect.py: `coldbrew inspect`'s description of a bundle,
line by line: what it is, its layers, tuning, accuracy, segments, totals,
signature."""
import pytest

from coldbrew.compiler import compile_model
from coldbrew.compiler.bundle.reader import read_bytes
from coldbrew.compiler.tools.inspect import accuracy_line, describe, signature_line, tuning_line


def test_the_description_covers_the_bundle(small_bundle):
    lines = describe(small_bundle)
    b, _, _ = read_bytes(open(small_bundle, "rb").read())
    heads = [ln.split()[0] for ln in lines if ln and not ln.startswith(" ")]
    for head in ("bundle", "model", "producer", "target", "tuning", "accuracy", "kernels", "segments", "totals",
                 "signature"):
        assert head in heads, head
    segments = lines.index("segments")
    assert len([ln for ln in lines[segments + 1:] if ln.startswith("  ")]) == len(b.segments)
    for layer in b.layers:  # every layer is named
        assert any(layer.name.decode() in ln for ln in lines)


def test_tuning_says_derived_unless_measured(small_bundle):
    b, _, _ = read_bytes(open(small_bundle, "rb").read())
    assert tuning_line(b).startswith("tuning     derived:")
    for s in b.plan.steps:
        s.kind.tuned = True
    assert tuning_line(b).startswith("tuning     tuned:")


def test_accuracy_line(small_model, small_bundle):
    b, _, _ = read_bytes(open(small_bundle, "rb").read())
    assert accuracy_line(b) == "accuracy   every weight fp32 (no narrowing to measure)"
    narrow, _, _ = read_bytes(compile_model(small_model, precision="fp16"))
    line = accuracy_line(narrow)
    assert line.startswith("accuracy   ") and "layers narrowed; model output error" in line


def test_signature_line(small_bundle, tmp_path):
    pytest.importorskip("nacl")
    from coldbrew.compiler.bundle.sign import keygen, sign

    data = open(small_bundle, "rb").read()
    assert signature_line(data).startswith("signature  none (unsigned")
    key = tmp_path / "k"
    keygen(str(key))
    signed = sign(data, str(key))
    assert signature_line(signed).endswith("valid for every byte")
    altered = bytearray(signed)
    altered[100] ^= 1
    assert "INVALID" in signature_line(bytes(altered))


def test_the_layers_on_the_generic_schedule_are_counted(small_bundle):
    b, _, _ = read_bytes(open(small_bundle, "rb").read())
    generic = sum(s.variant in (b"", b"generic", None) for s in b.plan.steps)
    line = next(ln for ln in describe(small_bundle) if ln.startswith("generic "))
    assert line.startswith(f"generic    {generic} of {len(b.plan.steps)} layers on the generic schedule")
