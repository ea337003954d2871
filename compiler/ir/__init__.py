"""What the passes share: the coldbrew Graph, weight forms and precisions, ONNX operator facts,
anchor names, Relax helpers, narrow weights' numbers, recurrent cells and loops unrolled, single
operators decomposed."""
