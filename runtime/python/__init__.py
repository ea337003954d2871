"""coldbrew: cold-start bundles for ONNX models.

    import coldbrew
    sess = coldbrew.load("model.brew")
    outputs = sess.run(None, {"x": array})

Importing coldbrew (or coldbrew.runtime) loads only the small C runtime; the
compiler (coldbrew.compiler, which uses TVM) is imported on demand.
"""
from .runtime import BundleError, InferenceSession, PendingSession, check_bundle, load

__all__ = ["load", "InferenceSession", "PendingSession", "BundleError", "check_bundle"]
