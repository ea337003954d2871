"""ONNX in, ONNX out: the operators coldbrew accepts and the rewrites the
front-end passes apply to a model's graph (single operators decomposed,
recurrent cells and loops unrolled, ConvTranspose as sub-pixel Convs)."""
