-- What changed in an inventory since a reader's last look, without reading the whole inventory
-- (stoa_cp.store.changes). Every row an inventory is made of carries the id of the transaction that
-- last wrote it; a reader keeps the snapshot it last read at and asks for the rows whose writer was
-- not visible in that snapshot (committed since), so no change is missed whatever the commit order.
-- Deleted rows leave their key in inventory_removals, written by the same transaction.
ALTER TABLE apis ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id();
ALTER TABLE deployments ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id();
ALTER TABLE tombstones ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id();
ALTER TABLE policies ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id();
ALTER TABLE issuers ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id();
CREATE INDEX apis_xid ON apis (xid);
CREATE INDEX deployments_xid ON deployments (xid);
CREATE INDEX tombstones_xid ON tombstones (xid);
CREATE INDEX policies_xid ON policies (xid);
CREATE INDEX issuers_xid ON issuers (xid);

CREATE FUNCTION stoa_mark_written() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.xid := pg_current_xact_id();
    RETURN NEW;
END $$;
CREATE TRIGGER apis_written BEFORE UPDATE ON apis FOR EACH ROW EXECUTE FUNCTION stoa_mark_written();
CREATE TRIGGER deployments_written BEFORE UPDATE ON deployments
    FOR EACH ROW EXECUTE FUNCTION stoa_mark_written();
CREATE TRIGGER tombstones_written BEFORE UPDATE ON tombstones
    FOR EACH ROW EXECUTE FUNCTION stoa_mark_written();
CREATE TRIGGER policies_written BEFORE UPDATE ON policies FOR EACH ROW EXECUTE FUNCTION stoa_mark_written();
CREATE TRIGGER issuers_written BEFORE UPDATE ON issuers FOR EACH ROW EXECUTE FUNCTION stoa_mark_written();

-- kind: route (gateway_id, item = api_id), tombstone (gateway_id, item = route_id), policy (item =
-- policy_id), issuer (item = issuer_id). Kept for a day: a reader whose last look is
-- older reads the inventory whole (stoa_cp.store.changes.RETENTION).
CREATE TABLE inventory_removals (
    xid         xid8 NOT NULL DEFAULT pg_current_xact_id(),
    kind        text NOT NULL,
    gateway_id  text NOT NULL DEFAULT '',
    item        text NOT NULL,
    removed_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX inventory_removals_xid ON inventory_removals (xid);
CREATE INDEX inventory_removals_at ON inventory_removals (removed_at);

CREATE FUNCTION stoa_note_removal() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'deployments' THEN
        INSERT INTO inventory_removals (kind, gateway_id, item) VALUES ('route', OLD.gateway_id, OLD.api_id);
    ELSIF TG_TABLE_NAME = 'tombstones' THEN
        INSERT INTO inventory_removals (kind, gateway_id, item) VALUES ('tombstone', OLD.gateway_id, OLD.route_id);
    ELSIF TG_TABLE_NAME = 'policies' THEN
        INSERT INTO inventory_removals (kind, item) VALUES ('policy', OLD.policy_id);
    ELSE
        INSERT INTO inventory_removals (kind, item) VALUES ('issuer', OLD.issuer_id);
    END IF;
    RETURN OLD;
END $$;
CREATE TRIGGER deployments_removed AFTER DELETE ON deployments FOR EACH ROW EXECUTE FUNCTION stoa_note_removal();
CREATE TRIGGER tombstones_removed AFTER DELETE ON tombstones FOR EACH ROW EXECUTE FUNCTION stoa_note_removal();
CREATE TRIGGER policies_removed AFTER DELETE ON policies FOR EACH ROW EXECUTE FUNCTION stoa_note_removal();
CREATE TRIGGER issuers_removed AFTER DELETE ON issuers FOR EACH ROW EXECUTE FUNCTION stoa_note_removal();
