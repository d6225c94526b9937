"""Artifacts held as chunk lists and read lazily: a mount serves an artifact's `.sqsh` from its
chunks (node cache, then a filesystem tier's copy, then S3), every chunk checked against its id
before a byte of it is served."""
