"""Everything that talks to Docker and BuildKit; no other package runs a docker command.

One module per component:
- `client`: connect to the engine named by `[builder]` and check that it answers;
- `api`: the Engine HTTP API on a local unix socket, read-only: the plan's inventory;
- `images`: exists / inspect / digest / history of images in that engine;
- `build`: build one layer image and tag it only once it is complete;
- `buildlog`: read BuildKit's plain progress output (pure, no engine);
- `containers`: the export's containers: create, stream `docker export`, remove;
- `registry`: push and pull layer images to and from the layer-cache registry;
- `farm`: builders that cannot see the engine's images: parents through the registry, a farm of them;
- `leftovers`: what makes that were killed left in the engine (export containers, make --check
  images), found and removed.

How each call reaches the engine:
- python-on-whales (`Engine.client`) for what acts on the engine: create and remove containers,
  tag and untag, pull, push, build a fixture image, inspect an image for its export, the tool
  versions;
- `Engine.run`, the docker CLI with a time limit, for the quick queries a plan and a make's
  start ask (does this image exist, its digest, the registry's manifest, the engine and builder
  checks): python-on-whales 0.81 takes no timeout, so a dead ssh:// engine or registry would hang
  a plan, and its import would add 0.15 s to a no-op plan. `image history` too, which
  python-on-whales 0.81 lacks;
- `Engine.api` (`api`), the third exception to python-on-whales: stdlib HTTP over the engine's
  unix socket with a time limit on every request, for the same inventory when the engine is local (`unix://`): does it answer, which
  efabuild/* tags exist, an image's ID and repository digests. One request costs well under a
  millisecond, a docker CLI process tens of them, and a no-op plan is little else. ssh://, tcp://
  and other docker contexts keep the CLI, which knows how to reach them;
- a subprocess of its own in three places, each saying why: the layer build (`build`), the
  `docker export` byte stream (`containers`), and a farm builder's root filesystem streamed as
  `buildx build --output type=tar,dest=-` (`farm`: python-on-whales 0.81 cannot stream those bytes).

Every program efabuild runs itself (these, `Engine.run`, mksquashfs and the other tools) is started
through `children`, which has the kernel kill it when efabuild dies: a kill -9 leaves none running.
python-on-whales starts its own short docker CLI calls; those end by themselves.
"""
