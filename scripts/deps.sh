#!/usr/bin/env bash
# Installs what basalt's tests need on Debian/Ubuntu: the real programs the
# end-to-end tests drive. Safe to run repeatedly; installs only what is missing.
set -euo pipefail

# command -> Debian package
declare -A need=(
  [etcd]=etcd-server     # external metadata engine for the --meta-endpoints e2e test
  [curl]=curl
  [openssl]=openssl
  # real NBD clients and peers the NBD tests and bench/nbd.sh drive
  [qemu-img]=qemu-utils  # qemu-img, qemu-io, qemu-nbd
  [nbdinfo]=libnbd-bin   # nbdinfo, nbdcopy, nbdsh
  [nbdfuse]=nbdfuse
  [nbdkit]=nbdkit
  [fio]=fio
  [fusermount3]=fuse3
  [fuse2fs]=fuse2fs
  [mkfs.ext4]=e2fsprogs
  [mkfs.xfs]=xfsprogs    # an XFS store: reflinks between volumes and objects (e2e)
  [rclone]=rclone        # rclone sync/check against the S3 gateway (e2e)
  [ip]=iproute2          # network namespaces for the partition and fencing tests (e2e)
)

missing=()
for cmd in "${!need[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${need[$cmd]}")
done
if ((${#missing[@]})); then
  echo "deps: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # The Debian package starts a system etcd on the default ports; the tests
  # run their own on free ports, so stop it.
  if [[ " ${missing[*]} " == *" etcd-server "* ]]; then
    $SUDO systemctl disable --now etcd >/dev/null 2>&1 || $SUDO service etcd stop >/dev/null 2>&1 || true
    $SUDO pkill -x etcd >/dev/null 2>&1 || true
  fi
fi
# S3 clients the object store's e2e tests drive (PyPI; Debian's packages as
# the fallback where pip is missing).
if ! command -v aws >/dev/null 2>&1 || ! python3 -c 'import boto3' >/dev/null 2>&1; then
  echo "deps: installing awscli and boto3"
  if python3 -m pip --version >/dev/null 2>&1; then
    python3 -m pip install --quiet awscli boto3
  else
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get install -y -qq --no-install-recommends awscli python3-boto3 >/dev/null
  fi
  hash -r
fi
command -v go >/dev/null || { echo "deps: Go is required (https://go.dev/dl/)" >&2; exit 1; }
