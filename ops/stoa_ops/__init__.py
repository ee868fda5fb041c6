"""What every STOA service offers its operators, written once.

- `endpoint`: the operator HTTP endpoint (`/health/live`, `/health/ready`, `/metrics` in the
  Prometheus text format written by prometheus-client, and any extra read-only document);
- `logs`: the JSON-lines log format every service writes (field names in the README);
- `address`: `host:port` parsing and the loopback check;
- `backoff`: bounded, fully jittered exponential backoff between reconnects;
- `policy_sets`: a site service's policy set over the Link's ADS (subscribe, ACK/NACK, the last few
  accepted sets by version), for the authorization and processing services alike;
- `site_settings`: the settings those two services share, their start-up checks, and reading them;
- `lifecycle`: how those two run until SIGTERM/SIGINT and stop what they started.
"""
