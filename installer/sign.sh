#!/bin/sh
# Authenticode-sign Windows executables in place with osslsigncode (Linux / macOS).
#
#   installer/sign.sh FILE.exe [FILE.exe ...]
#
# Environment:
#   CONVMEM_SIGN_PFX             PKCS#12 file (.pfx / .p12) holding the certificate and its key
#   CONVMEM_SIGN_PASSWORD_FILE   file holding its password (preferred: not in the process list)
#   CONVMEM_SIGN_PASSWORD        or the password itself (written to a private temporary file)
#   CONVMEM_SIGN_TIMESTAMP_URL   RFC 3161 timestamp server (needs a network); without one the
#                                signature stops validating when the certificate expires
#   CONVMEM_SIGN_REQUIRE_TIMESTAMP=1  refuse to sign without a timestamp server (releases)
#   CONVMEM_SIGN_CAFILE          optional: after signing, verify each file against this CA bundle
#
# The NSIS script calls this from `!finalize` / `!uninstfinalize` when CONVMEM_SIGN_PFX is set.
# Exit status: 0 when every file was signed (and verified, with CONVMEM_SIGN_CAFILE).
set -eu

if [ "$#" -eq 0 ]; then
    echo "usage: sign.sh FILE.exe [FILE.exe ...]" >&2
    exit 2
fi
if [ -z "${CONVMEM_SIGN_PFX:-}" ]; then
    echo "sign.sh: CONVMEM_SIGN_PFX is not set (a .pfx / .p12 certificate file)" >&2
    exit 2
fi
if [ ! -r "$CONVMEM_SIGN_PFX" ]; then
    echo "sign.sh: CONVMEM_SIGN_PFX does not name a readable file" >&2
    exit 2
fi
if [ "${CONVMEM_SIGN_REQUIRE_TIMESTAMP:-}" = 1 ] && [ -z "${CONVMEM_SIGN_TIMESTAMP_URL:-}" ]; then
    echo "sign.sh: CONVMEM_SIGN_REQUIRE_TIMESTAMP=1 but no CONVMEM_SIGN_TIMESTAMP_URL" >&2
    exit 2
fi
command -v osslsigncode >/dev/null 2>&1 || {
    echo "sign.sh: osslsigncode is not installed (apt-get install osslsigncode)" >&2
    exit 2
}

workdir=$(mktemp -d)
trap 'rm -rf "$workdir"' EXIT INT TERM
passfile=${CONVMEM_SIGN_PASSWORD_FILE:-}
if [ -z "$passfile" ]; then
    passfile="$workdir/pass"
    (umask 077 && printf '%s' "${CONVMEM_SIGN_PASSWORD:-}" >"$passfile")
fi

for file in "$@"; do
    out="$workdir/signed.exe"
    rm -f "$out"
    # shellcheck disable=SC2086 # ${X:+-ts "$X"}: no option without a URL, one word with it
    osslsigncode sign -pkcs12 "$CONVMEM_SIGN_PFX" -readpass "$passfile" -h sha256 -n "ConvMem" \
        ${CONVMEM_SIGN_TIMESTAMP_URL:+-ts "$CONVMEM_SIGN_TIMESTAMP_URL"} \
        -in "$file" -out "$out" >/dev/null
    # Overwrite in place: the file keeps its name, owner and permissions.
    cat "$out" >"$file"
    if [ -n "${CONVMEM_SIGN_CAFILE:-}" ]; then
        osslsigncode verify -CAfile "$CONVMEM_SIGN_CAFILE" -in "$file" >/dev/null
    fi
    echo "sign.sh: signed $file"
done
