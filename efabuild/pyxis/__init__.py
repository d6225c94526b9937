"""The cluster side: `efabuild lookup` (the stored .sqsh of a ref, its signature enforced at job
start) and the Pyxis importer that turns an image string into a verified .sqsh path."""
