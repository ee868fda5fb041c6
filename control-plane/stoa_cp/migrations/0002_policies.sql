-- Policies: gateway-scoped (gateway_id set) or tenant/api-scoped (tenant_id set). policy_id is global,
-- so an inventory never carries two policies with one id.
CREATE TABLE policies (
    policy_id   text PRIMARY KEY,
    type        text NOT NULL,
    config      jsonb NOT NULL,
    scope       text NOT NULL CHECK (scope IN ('gateway', 'tenant', 'api')),
    targets     text[] NOT NULL DEFAULT '{}',
    tenant_id   text REFERENCES tenants (tenant_id),
    gateway_id  text REFERENCES gateways (gateway_id) ON DELETE CASCADE,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CHECK ((scope = 'gateway') = (gateway_id IS NOT NULL AND tenant_id IS NULL)),
    CHECK ((scope <> 'gateway') = (tenant_id IS NOT NULL AND gateway_id IS NULL))
);
CREATE INDEX policies_tenant ON policies (tenant_id);
CREATE INDEX policies_gateway ON policies (gateway_id);
