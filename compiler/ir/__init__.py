"""Shared IR: the coldbrew Graph, ONNX operator facts, anchor names, Relax helpers, narrow weights' numbers."""
