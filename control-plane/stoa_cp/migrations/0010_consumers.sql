-- Consumers of a tenant's APIs, their API keys, plans and subscriptions; APIs gain the api_key mode
-- and jwt with a required subscription.
ALTER TABLE apis DROP CONSTRAINT IF EXISTS apis_auth_mode_check;
ALTER TABLE apis ADD CONSTRAINT apis_auth_mode_check CHECK (auth_mode IN ('jwt', 'none', 'api_key'));
-- The request header an api_key API reads its key from ('' unless api_key).
ALTER TABLE apis ADD COLUMN key_header text NOT NULL DEFAULT '';
-- jwt: the token's consumer must hold an active subscription to the API.
ALTER TABLE apis ADD COLUMN subscription boolean NOT NULL DEFAULT false;

CREATE TABLE consumers (
    tenant_id   text NOT NULL REFERENCES tenants (tenant_id),
    consumer_id text NOT NULL,
    name        text NOT NULL,
    client_ids  text[] NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, consumer_id)
);

-- A client id acts for one consumer within its tenant.
CREATE TABLE consumer_client_ids (
    tenant_id   text NOT NULL,
    client_id   text NOT NULL,
    consumer_id text NOT NULL,
    PRIMARY KEY (tenant_id, client_id),
    FOREIGN KEY (tenant_id, consumer_id) REFERENCES consumers (tenant_id, consumer_id) ON DELETE CASCADE
);

-- Only the SHA-256 of a key is stored (keys are 256-bit random: a fast hash is enough). A revoked
-- key stays, with revoked_at, and is delivered as revoked for as long as it exists: revocations only
-- grow. A deleted consumer's keys are revoked, not deleted.
CREATE TABLE api_keys (
    key_id      text PRIMARY KEY,
    tenant_id   text NOT NULL REFERENCES tenants (tenant_id),
    consumer_id text NOT NULL,
    prefix      text NOT NULL UNIQUE,
    key_sha256  bytea NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
CREATE INDEX api_keys_tenant ON api_keys (tenant_id, consumer_id);

CREATE TABLE plans (
    tenant_id      text NOT NULL REFERENCES tenants (tenant_id),
    plan_id        text NOT NULL,
    requests       integer NOT NULL CHECK (requests >= 1),
    window_seconds integer NOT NULL CHECK (window_seconds >= 1),
    billed         boolean NOT NULL DEFAULT false,
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, plan_id)
);

CREATE TABLE subscriptions (
    tenant_id       text NOT NULL,
    subscription_id text NOT NULL,
    consumer_id     text NOT NULL,
    api_id          text NOT NULL REFERENCES apis (api_id) ON DELETE CASCADE,
    plan_id         text NOT NULL,
    state           text NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'suspended')),
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, subscription_id),
    UNIQUE (tenant_id, consumer_id, api_id),
    FOREIGN KEY (tenant_id, consumer_id) REFERENCES consumers (tenant_id, consumer_id) ON DELETE CASCADE,
    -- A plan in use cannot be deleted.
    FOREIGN KEY (tenant_id, plan_id) REFERENCES plans (tenant_id, plan_id)
);
