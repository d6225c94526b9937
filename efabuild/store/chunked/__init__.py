"""The chunked S3 tier: a `.sqsh` cut into content-defined chunks (FastCDC, zstd) with an index,
published by the chunks the bucket lacks and fetched from seeds on the node plus downloads."""
