"""The build pipeline: a key's way from BUILD.toml to a stored .sqsh.

`prepare` gathers the facts a plan decides from (`context` hashes each layer's files through the
`hashcache`; base digests, images and stored artifacts come from the engine and the store) and
calls the pure `efabuild.plan`. `run` lints, then runs the plan: `schedule` orders the layers,
`engine_steps` is what a layer asks of the engine, `context` writes what the key saw for the
build, `publish` exports, describes and stores an artifact layer, and `records` keeps the inputs
behind each key for the next plan; `leftovers` sweeps what killed makes left. `check` rebuilds a stored layer to compare it; `reporter` is
the progress interface the CLI implements.
"""
