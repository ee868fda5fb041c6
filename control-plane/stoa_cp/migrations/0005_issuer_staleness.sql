-- An issuer whose jwks_uri has not been fetched successfully for longer than the stale bound: its keys
-- leave every inventory until a fetch succeeds again.
ALTER TABLE issuers ADD COLUMN stale boolean NOT NULL DEFAULT false;
