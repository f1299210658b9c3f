"""pgtask: the pg_task PostgreSQL job scheduler as a Python service."""

__version__ = "0.1.0"
