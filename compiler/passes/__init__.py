"""The CPU pipeline's passes, one module each (compiler/pipeline.py lists them in order)."""
