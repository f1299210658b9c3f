-- Structured tags: a jsonb column with a GIN index (jsonb_path_ops: small and fast for @>).
-- Query with: SELECT * FROM {table} WHERE "meta" @> '{"tenant": "acme"}'

-- column meta --
ALTER TABLE {table} ADD COLUMN "meta" jsonb NOT NULL DEFAULT '{{}}'

-- index meta_gin --
CREATE INDEX {name_meta_gin} ON {table} USING gin ("meta" jsonb_path_ops)
