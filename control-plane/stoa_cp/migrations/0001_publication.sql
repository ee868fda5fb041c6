-- Tenants, APIs, gateways, deployments and tombstones: the publication model.
CREATE TABLE tenants (
    tenant_id   text PRIMARY KEY,
    name        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE apis (
    api_id       text PRIMARY KEY,
    tenant_id    text NOT NULL REFERENCES tenants (tenant_id),
    name         text NOT NULL,
    upstream_url text NOT NULL,
    path_prefix  text NOT NULL,
    methods      text[] NOT NULL,
    timeout_ms   integer NOT NULL DEFAULT 0,
    auth_mode    text NOT NULL DEFAULT 'jwt' CHECK (auth_mode IN ('jwt', 'none')),
    scopes       text[] NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT apis_path_prefix_key UNIQUE (path_prefix)
);
CREATE INDEX apis_tenant ON apis (tenant_id);

CREATE TABLE gateways (
    gateway_id              text PRIMARY KEY,
    name                    text NOT NULL,
    credential_sha256       bytea NOT NULL UNIQUE,
    generation              bigint NOT NULL DEFAULT 1 CHECK (generation >= 1),
    acknowledged_generation bigint NOT NULL DEFAULT 0,
    snapshot_version        text NOT NULL DEFAULT '',
    failed_generation       bigint NOT NULL DEFAULT 0,
    last_report             jsonb,
    created_at              timestamptz NOT NULL DEFAULT now()
);

-- Deleting an API writes its tombstones first; its deployments then go with it.
CREATE TABLE deployments (
    gateway_id  text NOT NULL REFERENCES gateways (gateway_id) ON DELETE CASCADE,
    api_id      text NOT NULL REFERENCES apis (api_id) ON DELETE CASCADE,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (gateway_id, api_id)
);
CREATE INDEX deployments_api ON deployments (api_id);

CREATE TABLE tombstones (
    gateway_id  text NOT NULL REFERENCES gateways (gateway_id) ON DELETE CASCADE,
    route_id    text NOT NULL,
    generation  bigint NOT NULL,
    PRIMARY KEY (gateway_id, route_id)
);

CREATE TABLE sync_reports (
    id               bigserial PRIMARY KEY,
    gateway_id       text NOT NULL REFERENCES gateways (gateway_id) ON DELETE CASCADE,
    generation       bigint NOT NULL,
    status           text NOT NULL,
    reason           text NOT NULL,
    detail           text NOT NULL,
    snapshot_version text NOT NULL,
    received_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sync_reports_gateway ON sync_reports (gateway_id, id);
