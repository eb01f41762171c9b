#!/bin/sh
# One-shot job of docker-compose.yml (temporalio/admin-tools image): create Temporal's
# two PostgreSQL databases and bring their schemas to the versions shipped in the image.
# temporal-sql-tool reads the connection from SQL_PLUGIN, SQL_HOST, SQL_PORT, SQL_USER
# and SQL_PASSWORD. Safe to rerun: an existing database is kept, a schema already past
# the initial version is not reset, and update-schema applies only the versions not
# applied yet (so rerunning it with a newer admin-tools image upgrades the schema).
set -eu

: "${SQL_HOST:?SQL_HOST (the PostgreSQL host) is required}"
: "${SQL_USER:?SQL_USER is required}"
: "${SQL_PASSWORD:?SQL_PASSWORD is required}"
SCHEMA_DIR=/etc/temporal/schema/postgresql/v12

for db in temporal:temporal temporal_visibility:visibility; do
  name="${db%%:*}"
  versioned="$SCHEMA_DIR/${db#*:}/versioned"
  echo "database $name: create if missing, then update the schema from $versioned"
  temporal-sql-tool --database "$name" create-database
  temporal-sql-tool --database "$name" setup-schema -v 0.0
  temporal-sql-tool --database "$name" update-schema -d "$versioned"
done
echo "Temporal schema is up to date"
