"""Everything that talks to Docker and BuildKit, through python-on-whales.

One module per component:
- `client`: connect to the engine named by `[builder]` and check that it answers;
- `images`: exists / inspect / digest of images in that engine;
- `build`: build one layer image and tag it only once it is complete;
- `buildlog`: read BuildKit's plain progress output (pure, no engine);
- `registry`: push and pull layer images to and from the layer-cache registry;
- `leftovers`: export containers of makes that were killed, found and removed.
"""
