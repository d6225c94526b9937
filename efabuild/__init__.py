"""efabuild: NGC + EFA training images as content-addressed Enroot .sqsh artifacts.

The modules at this level are the pure core: they decide and parse, and reach no engine, store,
network or subprocess (tests/project/test_code_layout.py holds them to it).

- `model`, `settings`, `workspace`, `configfile`, `tomlkeys`, `grammar`: BUILD.toml and the graph
  files read into frozen values, each bad input one line naming its file and key;
- `refs`, `keys`, `dag`, `plan`: layer names and keys, the blake3 key of a layer's inputs, the
  layer graph, and what a make will do and why (from facts passed in);
- `redact`, `nccl`, `errors`, `notices`, `display`: secrets hidden in what is shown, NCCL
  settings, typed errors, the messages the library reports (the CLI prints them), and outside
  text escaped for a one-line message.

`host/` is the floor under the edge packages: safe filesystem access, processes and owners, child
processes, digests, scratch space. The edge packages do the work: `make/` (the pipeline from
facts to a stored .sqsh), `engine/` (every Docker and BuildKit call), `export/` (image to .sqsh),
`store/` (local, shared and S3 tiers), `signing/`, `provenance/`, `lint/`, `doctor/`, `pyxis/`
(lookup and the importer a job runs), and `cli/`, the only place that prints. Each imports only
its own floor or a lower one: core < host < store, engine, provenance, lint, doctor < export,
signing, pyxis < make < cli, in no circle (tests/project/test_code_layout.py).
"""

__version__ = "0.1.0"
