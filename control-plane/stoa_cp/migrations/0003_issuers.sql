-- Trusted token issuers per tenant, with the keys the CP ships to sites.
CREATE TABLE issuers (
    issuer_id    text PRIMARY KEY,
    tenant_id    text NOT NULL REFERENCES tenants (tenant_id),
    issuer       text NOT NULL,
    jwks_uri     text,
    jwks         jsonb NOT NULL,
    fetched_at   timestamptz,
    last_error   text NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT issuers_tenant_issuer_key UNIQUE (tenant_id, issuer)
);
