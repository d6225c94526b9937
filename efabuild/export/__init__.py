"""From an engine image to an Enroot-compatible .sqsh: the tar filter, mksquashfs, Enroot's files."""
