-- This instance's control backend (run on it at every connect): the claims of this instance are
-- alive while it is connected.
INSERT INTO "public"."task_instance" ("token", "pid", "started", "role")
SELECT %(token)s, a.pid, a.backend_start, a.usesysid FROM pg_stat_activity a WHERE a.pid = pg_backend_pid()
ON CONFLICT ("token") DO UPDATE SET "pid" = EXCLUDED."pid", "started" = EXCLUDED."started", "role" = EXCLUDED."role"
