-- The run log of the scheduled maintenance notebook, <table>_maintenance_run beside the task table:
-- pgtask/notebook_run.py writes a row per run, pgtask/metrics.py reads the last ones ("maintenance"
-- in metrics.sql). {rel_maintenance_run}: the table.

-- create --
-- The log, made by the first run.
CREATE TABLE IF NOT EXISTS {rel_maintenance_run} (
    "id" bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    "started" timestamptz NOT NULL,
    "finished" timestamptz NOT NULL,
    "ok" boolean NOT NULL,
    "summary" text NOT NULL,
    "period" float8,
    "host" text NOT NULL,
    "run_dir" text NOT NULL
)

-- insert --
-- One run: when it started, its verdict (ok: the summary line is "OK: …"), its schedule's period in
-- seconds (NULL: unknown), the host and the directory of the executed notebook. It ends now.
INSERT INTO {rel_maintenance_run} ("started", "finished", "ok", "summary", "period", "host", "run_dir")
VALUES (%(started)s, now(), %(ok)s, %(summary)s, %(period)s, %(host)s, %(run_dir)s)
