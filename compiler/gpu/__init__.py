"""The GPU path: variant selection, dlight schedules, the GLSL emitter and SPIR-V codegen, the GPU conv variants."""
