"""STOA's own protobuf contracts, compiled with grpcio-tools (see proto/generate.py)."""
