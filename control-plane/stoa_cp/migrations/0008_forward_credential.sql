-- An API may let the upstream also receive the credential the decision consumed (off by default).
ALTER TABLE apis ADD COLUMN forward_credential boolean NOT NULL DEFAULT false;
