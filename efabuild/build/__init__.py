"""The build pipeline: gather facts, plan, build on the engine, export, publish."""
