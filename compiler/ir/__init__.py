"""What the passes share past the ONNX front: the coldbrew Graph, weight forms and precisions,
anchor names, Relax helpers, narrow weights' numbers, branches decided at run time."""
