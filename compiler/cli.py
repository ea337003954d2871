"""The `coldbrew` command: compile, run, inspect."""
import os
import sys
import time

import click
import numpy as np


def _parse_shapes(values):
    shapes = {}
    for v in values:
        name, sep, dims = v.rpartition("=")
        if not sep or not name:
            raise click.BadParameter(f"'{v}': expected NAME=1x3x224x224")
        try:
            shapes[name] = [int(d) for d in dims.lower().split("x")]
        except ValueError:
            raise click.BadParameter(f"'{v}': dimensions must be integers like 1x3x224x224") from None
    return shapes


def _parse_choice(values):
    """["x", "c3=y"] -> {"*": "x", "c3": "y"}."""
    out = {}
    for v in values:
        key, sep, val = v.rpartition("=")
        out[key if sep else "*"] = val
    return out


@click.group()
@click.version_option(package_name="coldbrew")
def main():
    """coldbrew: ONNX models -> cold-start bundles."""


@main.command("compile")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="bundle file to write")
@click.option("--target", default="host", show_default=True, help="target name (see targets/)")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME=DxDx..", help="fix an input's shape")
@click.option("--bind", "binds", multiple=True, metavar="NAME=FILE.npy", help="freeze an input to a constant value")
@click.option("--variant", "variant_opts", multiple=True, metavar="[LAYER=]VARIANT",
              help="force a kernel variant: globally (im2col_gemm), per op (conv2d=winograd_f4) "
                   "or per layer (c3=direct); see `coldbrew variants`")
@click.option("--weights", "weight_opts", multiple=True, metavar="[LAYER=]raw|cached", default=["cached"],
              show_default=True, help="ship raw weights + transform, or transformed weights; global or per layer")
@click.option("--threads", default=2, show_default=True, help="execution threads the plan is made for")
@click.option("--dump-ir", type=click.Path(file_okay=False), help="write the IR after each pass here")
def compile_cmd(model, output, target, input_shapes, binds, variant_opts, weight_opts, threads, dump_ir):
    """Compile MODEL (ONNX) into a bundle."""
    from coldbrew.compiler import CompileError, compile_model

    t0 = time.perf_counter()
    constants = {}
    for b in binds:
        name, sep, path = b.partition("=")
        if not sep:
            raise click.BadParameter(f"'{b}': expected NAME=FILE.npy")
        constants[name] = np.load(path)
    try:
        data = compile_model(model, output, target=target, input_shapes=_parse_shapes(input_shapes),
                             constants=constants, dump_ir=dump_ir, variants=_parse_choice(variant_opts),
                             weights=_parse_choice(weight_opts), threads=threads)
    except CompileError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"wrote {output} ({len(data):,} bytes) in {time.perf_counter() - t0:.1f} s")


def _evict(path):
    """Drop a file from the page cache so the next read is cold."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@main.command("run")
@click.argument("bundle", type=click.Path(exists=True, dir_okay=False))
@click.option("--input", "inputs", multiple=True, metavar="NAME=FILE.npy", help="input from a .npy file")
@click.option("--output-dir", type=click.Path(file_okay=False), help="save outputs as NAME.npy here")
@click.option("--cold/--warm", default=True, show_default=True, help="evict the bundle from the page cache first")
@click.option("--repeat", default=10, show_default=True, help="warm runs after the first")
@click.option("--threads", default=0, help="execution threads (0 = the plan's)")
def run_cmd(bundle, inputs, output_dir, cold, repeat, threads):
    """Run BUNDLE once cold, then warm; print outputs and timings.

    Inputs not given are filled with seeded random data."""
    import coldbrew

    feeds_files = dict(v.split("=", 1) for v in inputs)
    if cold:
        _evict(bundle)
    t1 = time.perf_counter()
    try:
        sess = coldbrew.load(bundle, threads=threads)
    except coldbrew.BundleError as e:
        raise click.ClickException(str(e)) from None
    t_load = time.perf_counter() - t1
    rng = np.random.default_rng(0)
    feeds = {}
    for meta in sess.get_inputs():
        if meta.name in feeds_files:
            feeds[meta.name] = np.load(feeds_files.pop(meta.name))
        elif meta.dtype.kind == "f":
            feeds[meta.name] = rng.standard_normal(meta.shape).astype(meta.dtype)
        else:
            feeds[meta.name] = np.zeros(meta.shape, meta.dtype)
    if feeds_files:
        raise click.ClickException(f"unknown input(s) {sorted(feeds_files)}; inputs are {[m.name for m in sess.get_inputs()]}")
    t2 = time.perf_counter()
    try:
        outs = sess.run(None, feeds)
    except (coldbrew.BundleError, ValueError, TypeError) as e:
        raise click.ClickException(str(e)) from None
    t_first = time.perf_counter() - t2
    warm = []
    for _ in range(repeat):
        t = time.perf_counter()
        sess.run(None, feeds)
        warm.append(time.perf_counter() - t)
    for meta, out in zip(sess.get_outputs(), outs):
        flat = out.reshape(-1)
        top = int(np.argmax(flat)) if flat.size and out.dtype.kind == "f" else None
        click.echo(f"output {meta.name} {out.dtype}{list(out.shape)}  min {flat.min():.4g} max {flat.max():.4g}"
                   + (f"  argmax {top}" if top is not None else ""))
        if output_dir:
            os.makedirs(output_dir, exist_ok=True)
            np.save(os.path.join(output_dir, f"{meta.name}.npy"), out)
    click.echo(f"{'cold' if cold else 'warm-cache'} load {t_load * 1e3:.2f} ms + first run {t_first * 1e3:.2f} ms "
               f"= {(t_load + t_first) * 1e3:.2f} ms to first result")
    if warm:
        click.echo(f"warm run median {np.median(warm) * 1e3:.2f} ms over {repeat}")


@main.command("variants")
def variants_cmd():
    """List the kernel variants."""
    from coldbrew.compiler.kernels import variants

    for v in variants():
        click.echo(f"{v.name:<28} {(v.__doc__ or '').strip().splitlines()[0] if v.__doc__ else ''}")


@main.command("inspect")
@click.argument("bundle", type=click.Path(exists=True, dir_okay=False))
@click.option("--verify", is_flag=True, help="also open it with the runtime (full verification)")
def inspect_cmd(bundle, verify):
    """Show everything in BUNDLE: target, layers and variants, segments, totals."""
    from .inspect_bundle import InspectError, describe

    try:
        for line in describe(bundle):
            click.echo(line)
    except InspectError as e:
        raise click.ClickException(str(e)) from None
    if verify:
        import coldbrew

        try:
            coldbrew.load(bundle).close()
        except coldbrew.BundleError as e:
            raise click.ClickException(f"verification failed: {e}") from None
        click.echo("verify     ok (runtime accepted the bundle on this machine)")


if __name__ == "__main__":
    sys.exit(main())
