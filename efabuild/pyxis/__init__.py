"""The cluster side: the Pyxis importer that turns an image string into a verified .sqsh path."""
