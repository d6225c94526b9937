"""A minimal training entry point: checks the EFA path is configured, then would start training."""

import os


def main() -> None:
    plugin = os.environ.get("NCCL_NET_PLUGIN")
    if plugin != "ofi":
        raise SystemExit(f"NCCL_NET_PLUGIN={plugin!r}: NCCL would fall back to sockets; expected 'ofi'")
    print("NCCL_NET_PLUGIN=ofi, LD_LIBRARY_PATH starts with", os.environ.get("LD_LIBRARY_PATH", "").split(":")[:2])


if __name__ == "__main__":
    main()
