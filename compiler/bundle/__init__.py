"""The bundle file: reader, checksum, signing."""
