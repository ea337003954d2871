"""The bundle schema (bundle.fbs) and its generated Python reader/builder."""
from .generated import bundle_generated  # noqa: F401
