DELETE FROM "public"."task_instance" WHERE "token" = %(token)s
