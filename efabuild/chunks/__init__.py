"""Chunks: an artifact cut into content-defined chunks named by their blake3, and the index that
lists them. Below both the export (which cuts what it writes) and the store (which keeps, sends and
fetches chunks): it imports neither."""
