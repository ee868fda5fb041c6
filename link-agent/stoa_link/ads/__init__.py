"""The Link's ADS server, in rooms:

- `identity`: the server's TLS material and who a client is (its verified URI SAN);
- `stream`: the xDS protocol per client stream (subscriptions, nonces, ACK/NACK tracking);
- `publish`: publication order (policy sets; CDS old and new, LDS, RDS; CDS new) and rollback;
- `server`: the gRPC service tying them together on a loopback address.
"""

from stoa_link.ads.identity import TlsMaterial, peer_identity
from stoa_link.ads.publish import PublishResult, elapsed_ms
from stoa_link.ads.server import AdsServer
from stoa_link.ads.stream import AdsEvent

__all__ = ["AdsEvent", "AdsServer", "PublishResult", "TlsMaterial", "elapsed_ms", "peer_identity"]
