#!/usr/bin/env bash
# Builds the Cairn container image (default tag cairn:dev) FROM scratch, with no registry.
#
# The release binaries of the shipped packages are built here, then a root filesystem is assembled holding exactly:
# the binaries (cairn, cairn-worker, cairn-probe, and cairnctl when it was built), the shared
# libraries `ldd` says they load plus the dynamic loader (at their own paths), /etc/passwd and
# /etc/group with the unprivileged user `cairn` (uid/gid 10001), /etc/nsswitch.conf, a sticky
# /tmp, and /data, /checkpoints, /output owned by 10001 (named volumes mounted there inherit
# that ownership). The image runs as uid 10001; its HEALTHCHECK is `cairn-probe health`.
#
# Usage: deploy/build-image.sh [--skip-build]
#   CAIRN_IMAGE        tag to build (default cairn:dev)
#   CARGO_TARGET_DIR   cargo's target directory (default <repo>/target); the staging tree
#                      goes to $CARGO_TARGET_DIR/cairn-image
#   --skip-build       use the release binaries already built
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
image=${CAIRN_IMAGE:-cairn:dev}
target=${CARGO_TARGET_DIR:-$repo/target}
case $target in /*) ;; *) target=$repo/$target ;; esac
release=$target/release
stage=$target/cairn-image
skip_build=false

for arg in "$@"; do
  case $arg in
    --skip-build) skip_build=true ;;
    -h | --help)
      sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "build-image.sh: unknown argument $arg (see --help)" >&2
      exit 2
      ;;
  esac
done

for tool in docker ldd; do
  command -v "$tool" >/dev/null || {
    echo "build-image.sh: $tool is required but not on PATH" >&2
    exit 1
  }
done

# The packages whose binaries ship in the image (not the test and benchmark binaries).
packages=(-p cairn-coordinator -p cairn-taskrt)
if grep -q '"ctl"' "$repo/Cargo.toml" && [[ -f $repo/ctl/Cargo.toml ]]; then
  packages+=(-p cairn-ctl)
fi
if ! $skip_build; then
  echo "==> cargo build --release --bins ${packages[*]} (target dir $target)"
  (cd "$repo" && cargo build --release --bins "${packages[@]}")
fi

bins=(cairn cairn-worker cairn-probe)
[[ -x $release/cairnctl ]] && bins+=(cairnctl)
for b in "${bins[@]}"; do
  [[ -x $release/$b ]] || {
    echo "build-image.sh: $release/$b is missing; run without --skip-build" >&2
    exit 1
  }
done

echo "==> assembling the root filesystem in $stage"
rm -rf "$stage"
rootfs=$stage/rootfs
writable=$stage/writable
mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc" "$rootfs/tmp" \
  "$writable/data" "$writable/checkpoints" "$writable/output"
chmod 1777 "$rootfs/tmp"

# Binaries without their debug info (the release profile keeps line tables for backtraces on
# the build machine; the image does not need them).
for b in "${bins[@]}"; do
  if command -v objcopy >/dev/null; then
    objcopy --strip-debug "$release/$b" "$rootfs/usr/local/bin/$b"
  else
    cp "$release/$b" "$rootfs/usr/local/bin/$b"
  fi
done

# Every library the binaries load, and the loader, at the path the binary asks for (symlinks
# resolved: the image has only the files).
declare -A libs=()
for b in "${bins[@]}"; do
  if ! out=$(ldd "$release/$b" 2>&1); then
    echo "build-image.sh: ldd $release/$b failed: $out" >&2
    exit 1
  fi
  while read -r line; do
    case $line in
      *"not found"*)
        echo "build-image.sh: $b needs a library that is not installed: $line" >&2
        exit 1
        ;;
      *"=> /"*) path=${line#*=> } ;;
      /*) path=$line ;;
      *) continue ;; # linux-vdso.so.1 and the like live in the kernel
    esac
    libs[${path%% (*}]=1
  done <<<"$out"
done
for lib in "${!libs[@]}"; do
  mkdir -p "$rootfs$(dirname "$lib")"
  cp -L "$lib" "$rootfs$lib"
done

cat >"$rootfs/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
cairn:x:10001:10001:Cairn:/data:/sbin/nologin
EOF
cat >"$rootfs/etc/group" <<'EOF'
root:x:0:
cairn:x:10001:
EOF
# Name resolution through /etc/hosts, then DNS (peers are found by their service names).
echo 'hosts: files dns' >"$rootfs/etc/nsswitch.conf"

cp "$here/Dockerfile" "$stage/Dockerfile"

echo "==> files in the image"
(cd "$rootfs" && find . -type f -printf '  /%P  %s bytes\n' | sort)

echo "==> docker build -t $image"
docker build --quiet -t "$image" "$stage" >/dev/null
docker image inspect "$image" --format "built $image: {{.Id}} ({{.Size}} bytes)"
