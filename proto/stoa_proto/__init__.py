"""STOA's own protobuf contracts, compiled with grpcio-tools (see proto/generate.py)."""

# The inventory schema the CP writes and the Link reads (Inventory.schema_version).
# 2: typed policy configs (Policy.config is a oneof, one message per kind).
INVENTORY_SCHEMA_VERSION = 2
