#!/bin/sh
# One-shot job of docker-compose.yml (temporalio/admin-tools image): wait until the
# Temporal cluster serves, make sure the namespace exists, then register boundloop's
# search attributes in it. Safe to rerun: a namespace or attribute that already exists
# (with the same type) is kept; an attribute registered with another type is an error.
set -eu

: "${TEMPORAL_ADDRESS:?TEMPORAL_ADDRESS (host:port of the frontend) is required}"
: "${SEARCH_ATTRIBUTES:?SEARCH_ATTRIBUTES (space-separated Name=Type pairs) is required}"
NAMESPACE="${TEMPORAL_NAMESPACE:-default}"
RETENTION="${TEMPORAL_NAMESPACE_RETENTION:-7d}"
ATTEMPTS="${SETUP_ATTEMPTS:-60}"
DELAY="${SETUP_DELAY_SECONDS:-2}"

retry() {
  n=1
  until "$@"; do
    if [ "$n" -ge "$ATTEMPTS" ]; then
      echo "giving up after $n attempts: $*" >&2
      return 1
    fi
    n=$((n + 1))
    sleep "$DELAY"
  done
}

t() { temporal "$@" --address "$TEMPORAL_ADDRESS"; }

echo "waiting for the Temporal cluster at $TEMPORAL_ADDRESS"
retry t operator cluster health

if t operator namespace describe --namespace "$NAMESPACE" >/dev/null 2>&1; then
  echo "namespace $NAMESPACE: already exists"
else
  # Another job may create it at the same moment: then describe succeeds below.
  t operator namespace create --namespace "$NAMESPACE" --retention "$RETENTION" \
    || t operator namespace describe --namespace "$NAMESPACE" >/dev/null
  echo "namespace $NAMESPACE: created (retention $RETENTION)"
fi
# A new namespace reaches every frontend cache only after a refresh: wait until a
# namespace-scoped call works, so the workers started after this job find it.
retry t workflow list --namespace "$NAMESPACE" --limit 1 >/dev/null

for spec in $SEARCH_ATTRIBUTES; do
  name="${spec%%=*}"
  type="${spec#*=}"
  want="INDEXED_VALUE_TYPE_$(printf %s "$type" | tr '[:lower:]' '[:upper:]')"
  listed="$(t operator search-attribute list --namespace "$NAMESPACE" --output json)"
  current="$(printf '%s\n' "$listed" | sed -n "s/^ *\"$name\": *\"\([A-Z_]*\)\".*/\1/p")"
  if [ "$current" = "$want" ]; then
    echo "search attribute $name ($type): already registered"
    continue
  fi
  if [ -n "$current" ]; then
    echo "search attribute $name is registered as $current, boundloop needs $type;" \
         "remove or rename it first" >&2
    exit 1
  fi
  retry t operator search-attribute create --namespace "$NAMESPACE" \
    --name "$name" --type "$type"
  echo "search attribute $name ($type): registered"
done
echo "namespace $NAMESPACE is ready for boundloop"
