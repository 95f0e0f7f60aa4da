#!/usr/bin/env bash
# Makes a throwaway security setup for a pipetrain cluster in DIR: a CA,
# certificates for the scheduler, WORKERS workers and one client (each
# usable for both ends of mutual TLS), bearer tokens for the control API
# and a join token for workers. Keys never leave DIR (mode 0700).
#
#   deploy/pki.sh DIR [WORKERS] [EXTRA_SANS]
#
# WORKERS is a count (names pipetrain-worker-0, -1, ...) or a comma-separated
# list of worker names (e.g. compose service names). Certificates:
# CN=pipetrain-scheduler, CN=<worker name>, CN=pipetrain-client; each also
# carries DNS:localhost, IP:127.0.0.1, DNS:<its CN> and EXTRA_SANS
# (comma-separated, e.g. "DNS:scheduler").
# Files: ca.crt, <name>.crt, <name>.key, tokens (operator and viewer
# lines), operator.token, viewer.token, join.token.
set -euo pipefail

dir=${1:?usage: pki.sh DIR [WORKERS] [EXTRA_SANS]}
workers=${2:-3}
extra=${3:-}
command -v openssl >/dev/null || { echo "pki.sh: openssl is missing (deploy/setup.sh installs it)" >&2; exit 1; }

mkdir -p "$dir"
chmod 700 "$dir"
umask 077
cd "$dir"

ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
openssl req -x509 "${ec[@]}" -days 30 -subj "/CN=pipetrain-demo-ca" \
  -keyout ca.key -out ca.crt 2>/dev/null

issue() {  # name
  local name=$1 sans="DNS:localhost,IP:127.0.0.1,DNS:$1"
  [ -n "$extra" ] && sans="$sans,$extra"
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$sans" >"$name.ext"
  openssl req "${ec[@]}" -subj "/CN=$name" -keyout "$name.key" -out "$name.csr" 2>/dev/null
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial \
    -days 30 -extfile "$name.ext" -out "$name.crt" 2>/dev/null
  rm -f "$name.csr" "$name.ext"
}

issue pipetrain-scheduler
if [[ "$workers" =~ ^[0-9]+$ ]]; then
  for i in $(seq 0 $((workers - 1))); do issue "pipetrain-worker-$i"; done
else
  for name in ${workers//,/ }; do issue "$name"; done
fi
issue pipetrain-client

openssl rand -hex 24 >operator.token
openssl rand -hex 24 >viewer.token
openssl rand -hex 24 >join.token
{
  echo "# bearer tokens of the control API: TOKEN ROLE"
  echo "$(cat operator.token) operator"
  echo "$(cat viewer.token) viewer"
} >tokens
# Certificates are public; keys and tokens stay private to the owner.
chmod 644 ca.crt ./*.crt
