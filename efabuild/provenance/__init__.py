"""Provenance of artifacts: what is really inside an image, recorded and checked.

`fsview` reads an image filesystem (a directory or a .sqsh) without extracting it, `probe` measures
versions from it, `manifest` and `intoto` record them, `audit` and `diff` compare.
"""
