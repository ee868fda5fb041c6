-- The current signed tool permissions of each gateway: a compact JWS the CP re-signs before it
-- expires and on every change of its content. seq only grows (the module refuses a lower one).
CREATE TABLE tool_permissions (
    gateway_id  text PRIMARY KEY REFERENCES gateways (gateway_id) ON DELETE CASCADE,
    seq         bigint NOT NULL,
    jti         text NOT NULL,
    kid         text NOT NULL,
    digest      text NOT NULL,
    jws         text NOT NULL,
    issued_at   timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL
);
