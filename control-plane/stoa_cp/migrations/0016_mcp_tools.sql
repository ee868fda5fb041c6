-- MCP: an API's kind ("http" proxies to its upstream; "mcp" is answered by the site's MCP module and
-- has no upstream), the tenant's tools (operations of its APIs), their grants and revocations.
ALTER TABLE apis ADD COLUMN kind text NOT NULL DEFAULT 'http' CHECK (kind IN ('http', 'mcp'));

CREATE TABLE tools (
    tenant_id      text NOT NULL REFERENCES tenants (tenant_id),
    name           text NOT NULL,
    description    text NOT NULL,
    input_schema   jsonb NOT NULL,
    output_schema  jsonb,
    annotations    jsonb,
    -- A tool is an operation of one of its tenant's APIs; the API cannot go while a tool uses it.
    api_id         text NOT NULL REFERENCES apis (api_id),
    method         text NOT NULL,
    path_template  text NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, name)
);
CREATE INDEX tools_api ON tools (api_id);

-- A caller holding any listed scope, or being a listed consumer, may call the tool.
CREATE TABLE tool_grants (
    grant_id    text PRIMARY KEY,
    tenant_id   text NOT NULL REFERENCES tenants (tenant_id),
    tool        text NOT NULL,
    consumers   text[] NOT NULL DEFAULT '{}',
    scopes      text[] NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (tenant_id, tool) REFERENCES tools (tenant_id, name) ON DELETE CASCADE
);
CREATE INDEX tool_grants_tenant ON tool_grants (tenant_id);

-- Overrides every grant of the tool: for one consumer, or for everyone when consumer is NULL.
CREATE TABLE tool_revocations (
    revocation_id  text PRIMARY KEY,
    tenant_id      text NOT NULL REFERENCES tenants (tenant_id),
    tool           text NOT NULL,
    consumer       text,
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX tool_revocations_tenant ON tool_revocations (tenant_id);
