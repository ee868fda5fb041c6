-- Policy configs become typed (one message per kind in the inventory). config_schema 1 marks a row
-- written before: at start the CP re-reads each such config by the translator's rules
-- (stoa_cp.store.policies.adopt_typed_configs), stores its normal form, or keeps it with the reason it
-- is refused in invalid_reason. An invalid policy is shown by the API and left out of inventories.
ALTER TABLE policies ADD COLUMN config_schema smallint NOT NULL DEFAULT 1;
ALTER TABLE policies ADD COLUMN invalid_reason text;
-- Rows written from now on are typed and in normal form already.
ALTER TABLE policies ALTER COLUMN config_schema SET DEFAULT 2;
