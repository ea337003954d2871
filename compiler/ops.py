"""The operators coldbrew supports: the one list every other part consults."""

# ONNX default-domain operator types accepted by the compiler. Each one is
# covered by the ONNX backend node tests (tests/compiler/test_onnx_node.py).
SUPPORTED_OPS = frozenset("""
Abs Add And ArgMax ArgMin AveragePool BatchNormalization Cast Ceil Clip Concat
Constant ConstantOfShape Conv ConvTranspose Cos Div Dropout Elu Equal Erf Exp
Expand Flatten Floor Gather Gelu Gemm GlobalAveragePool GlobalMaxPool Greater
GreaterOrEqual HardSigmoid HardSwish Identity InstanceNormalization
LayerNormalization LeakyRelu Less LessOrEqual Log MatMul Max MaxPool Mean Min
Mul Neg Not Or Pad Pow PRelu Range Reciprocal ReduceMax ReduceMean ReduceMin
ReduceProd ReduceSum ReduceSumSquare Relu Reshape Resize Shape Sigmoid Sign Sin
Size Slice Softmax Softplus Split Sqrt Squeeze Sub Sum Tanh Tile Transpose
Unsqueeze Where
""".split())

MIN_OPSET = 7
MAX_OPSET = 23
