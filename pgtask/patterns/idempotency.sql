-- Idempotency key: a partial unique index over the live states only (PLAN, TAKE, WORK), so a
-- duplicate INSERT of a pending job is a no-op while the key can be used again once it settled.

-- column idem_key --
ALTER TABLE {table} ADD COLUMN "idem_key" text

-- index idem_key_uq --
CREATE UNIQUE INDEX {name_idem_key_uq} ON {table} ("idem_key")
WHERE "idem_key" IS NOT NULL AND "state" IN ('PLAN', 'TAKE', 'WORK')

-- query enqueue --
-- Insert unless a live task with this key exists; returns the new id, or no row for a duplicate.
INSERT INTO {table} ("input", "idem_key", "data") VALUES (%(input)s, %(idem_key)s, %(data)s)
ON CONFLICT ("idem_key") WHERE "idem_key" IS NOT NULL AND "state" IN ('PLAN', 'TAKE', 'WORK') DO NOTHING
RETURNING "id"
