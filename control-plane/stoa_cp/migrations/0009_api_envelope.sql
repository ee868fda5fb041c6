-- Whether an API's upstream gets the signed identity envelope (which places its decision in the
-- authorization service). Existing APIs keep the default: no envelope.
ALTER TABLE apis ADD COLUMN envelope boolean NOT NULL DEFAULT false;
