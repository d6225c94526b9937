"""efabuild: NGC + EFA training images as content-addressed Enroot .sqsh artifacts."""

__version__ = "0.1.0"
