"""Chronicle's processes: the HTTP API, the projector, the CLI and the local stack."""
