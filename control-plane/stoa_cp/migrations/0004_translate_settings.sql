-- The settings that shape a gateway's translation, as its Link last reported them (NULL: none yet);
-- the translation preview uses them.
ALTER TABLE gateways ADD COLUMN translate_settings jsonb;
