-- Who changed what, when, and which generation it produced. Written for every write on the CP API;
-- never holds a secret (no token, no credential, no key).
CREATE TABLE audit_log (
    id           bigserial PRIMARY KEY,
    at           timestamptz NOT NULL DEFAULT now(),
    subject      text NOT NULL,
    role         text NOT NULL,
    actor_tenant text,
    issuer       text NOT NULL,
    method       text NOT NULL,
    path         text NOT NULL,
    status       integer NOT NULL,
    -- The tenant whose object was written (NULL for platform objects: gateways, gateway policies).
    tenant_id    text,
    object_ids   jsonb NOT NULL DEFAULT '{}',
    generations  jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX audit_log_at ON audit_log (at);
CREATE INDEX audit_log_tenant_at ON audit_log (tenant_id, at);
CREATE INDEX audit_log_actor_tenant_at ON audit_log (actor_tenant, at);
