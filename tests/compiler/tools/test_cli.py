"""compiler/tools/cli.py: the `coldbrew` command's compile, inspect,
targets and variants, and its refusals: one clear line, no traceback."""
import os

import onnx
import pytest
from click.testing import CliRunner

from coldbrew.compiler.tools.cli import _parse_choice, _parse_queues, _parse_shapes, main


@pytest.fixture(scope="module")
def model_file(tmp_path_factory, small_model):
    path = tmp_path_factory.mktemp("cli") / "small.onnx"
    onnx.save(small_model, str(path))
    return str(path)


def test_compile_writes_the_bundle_and_says_so(model_file, tmp_path):
    out = tmp_path / "m.brew"
    r = CliRunner().invoke(main, ["compile", model_file, "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert f"wrote {out} ({os.path.getsize(out):,} bytes)" in r.output
    assert open(out, "rb").read(8) == b"COLDBREW"


def test_inspect_describes_a_bundle(small_bundle):
    r = CliRunner().invoke(main, ["inspect", small_bundle])
    assert r.exit_code == 0 and r.output.startswith(f"bundle     {small_bundle}")
    assert "\ntuning     derived" in r.output


@pytest.mark.parametrize("args,message", [
    (["compile", "missing.onnx", "-o", "x.brew"], "missing.onnx"),
    (["compile", "MODEL", "-o", "x.brew", "--input-shape", "x=1xAx3"], "dimension 'A' is not declared"),
    (["compile", "MODEL", "-o", "x.brew", "--input-shape", "x=1x[9:3]x3"], "is not a range"),
    (["compile", "MODEL", "-o", "x.brew", "--target", "no_such_target"], "no_such_target"),
    (["compile", "MODEL", "-o", "x.brew", "--variant", "c0=no_such_variant"], "no_such_variant"),
    (["compile", "MODEL", "-o", "x.brew", "--tune", "--target", "sd855"], "--tune"),
    (["inspect", "MODEL"], "not a coldbrew bundle"),
])
def test_bad_input_gets_one_clear_line(model_file, tmp_path, args, message):
    args = [model_file if a == "MODEL" else str(tmp_path / a) if a.endswith(".brew") else a for a in args]
    r = CliRunner().invoke(main, args)
    assert r.exit_code != 0
    assert message in r.output and "Traceback" not in r.output
    assert not isinstance(r.exception, Exception) or isinstance(r.exception, SystemExit)


def test_ops_lists_every_supported_operator_and_the_counted_ones():
    from coldbrew.compiler.onnx.ops import COUNTED_OPS, SUPPORTED_OPS

    r = CliRunner().invoke(main, ["ops"])
    assert r.exit_code == 0, r.output
    words = set(r.output.split())
    assert SUPPORTED_OPS <= words and set(COUNTED_OPS) <= words
    assert f"{len(SUPPORTED_OPS)} operators (ONNX's at opsets" in r.output


def test_targets_and_variants_are_listed():
    r = CliRunner().invoke(main, ["targets"])
    assert r.exit_code == 0 and "\nhost " in r.output and "sd855" in r.output
    r = CliRunner().invoke(main, ["variants"])
    assert r.exit_code == 0 and "conv2d.blocked" in r.output


def test_option_parsers():
    assert _parse_shapes(["input.1=1x3x224x224"]) == {"input.1": "1x3x224x224"}  # options.input_dims reads it
    assert _parse_shapes(["x=1x[H=32:64]x8", "a=b=2"]) == {"x": "1x[H=32:64]x8", "a=b": "2"}
    assert _parse_choice(["winograd_f2", "c3=direct"]) == {"*": "winograd_f2", "c3": "direct"}
    assert _parse_queues(["1", "c2=0"]) == {"*": 1, "c2": 0}
