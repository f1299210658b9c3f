-- Dry-run validation: a row inserted with dry_run = true has its input executed inside the INSERT
-- and then rolled back (a savepoint and a sentinel error), and is stored as STOP -- with the error
-- text in "error" if the input failed, NULL if it ran cleanly. It never runs for real.
-- The function deliberately has no search_path of its own: input runs as and like the inserting
-- session. It goes through SPI, so COPY and transaction control are rejected here even where a
-- real run would accept them.

-- column dry_run --
ALTER TABLE {table} ADD COLUMN "dry_run" boolean NOT NULL DEFAULT false

-- function dry_run --
CREATE OR REPLACE FUNCTION {fn_dry_run}() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
    IF NOT NEW."dry_run" THEN
        RETURN NEW;
    END IF;
    BEGIN
        EXECUTE NEW."input";
        RAISE SQLSTATE 'PGTDR' USING MESSAGE = 'dry run: rollback sentinel';
    EXCEPTION WHEN OTHERS THEN
        IF SQLSTATE <> 'PGTDR' THEN
            NEW."error" := 'ERROR:  ' || SQLERRM;
        END IF;
    END;
    NEW."state" := 'STOP';
    RETURN NEW;
END
$body$

-- trigger dry_run --
CREATE TRIGGER {name_dry_run} BEFORE INSERT ON {table} FOR EACH ROW WHEN (NEW."dry_run")
EXECUTE FUNCTION {fn_dry_run}()
