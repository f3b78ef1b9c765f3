#!/usr/bin/env bash
# Builds gpucoord's container image without a registry: `CGO_ENABLED=0 go
# build`, then buildah from scratch into root's containers-storage (where
# podman finds it), no base image pulled from anywhere.
#
#   scripts/image.sh                 # localhost/gpucoord:dev
#   IMAGE=localhost/gpucoord:v1 scripts/image.sh
#   OCI=gpucoord.oci scripts/image.sh   # also an OCI layout archive, for `skopeo copy`
#
# The image holds /usr/local/bin/gpucoord and what it loads: CGO_ENABLED=0
# does not make it static, because the run-time NCCL loader (purego)
# imports libc's dlopen, so the binary names the dynamic loader and
# libc.so.6, libdl.so.2 and libpthread.so.0, which are copied from this
# machine (Debian's libc6), as ldd lists them. It runs as uid 65532, with
# /tmp (1777) and /var/lib/gpucoord (its HOME, its own) for a read-only
# root file system to mount volumes on. It prints the image's
# name, id and size.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${IMAGE:-localhost/gpucoord:dev}
BIN=/usr/local/bin/gpucoord # deploy/kubernetes.Entrypoint
export GOTOOLCHAIN=local

for tool in buildah go ldd; do
	command -v "$tool" >/dev/null || { echo "image.sh: $tool is not installed (scripts/deps.sh installs buildah)" >&2; exit 1; }
done
work=$(mktemp -d)
ctr=""
cleanup() {
	[ -n "$ctr" ] && buildah rm "$ctr" >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT

version=$(git describe --always --dirty 2>/dev/null || echo devel)
root=$work/rootfs
mkdir -p "$root/usr/local/bin" "$root/tmp" "$root/var/lib/gpucoord"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=$version" -o "$root$BIN" ./cmd/gpucoord
# Whatever the binary names (the loader, libc), at the same paths.
for lib in $(ldd "$root$BIN" 2>/dev/null | grep -o '/[^ ]*' || true); do
	mkdir -p "$root$(dirname "$lib")"
	cp -L "$lib" "$root$lib"
done
chmod 1777 "$root/tmp"
chmod 0775 "$root/var/lib/gpucoord"

ctr=$(buildah from scratch)
buildah copy --quiet "$ctr" "$root" / >/dev/null
# HOME, writable by the image's user when no volume is mounted there.
buildah copy --quiet --chown 65532:65532 "$ctr" "$root/var/lib" /var/lib >/dev/null
buildah config \
	--entrypoint "[\"$BIN\"]" --cmd '["version"]' \
	--user 65532:65532 --workingdir /var/lib/gpucoord \
	--env PATH=/usr/local/bin --env HOME=/var/lib/gpucoord --env TMPDIR=/tmp \
	--label org.opencontainers.image.title=gpucoord \
	--label org.opencontainers.image.version="$version" \
	--label org.opencontainers.image.description="gpucoord: a distributed training coordinator (coordinator, worker agent, launch)" \
	"$ctr"
id=$(buildah commit --quiet --rm "$ctr" "$IMAGE")
ctr=""
if [ -n "${OCI:-}" ]; then
	rm -f "$OCI"
	buildah push --quiet "$IMAGE" "oci-archive:$OCI:$IMAGE"
fi
size=$(buildah images --noheading --format '{{.Size}}' "$id" | head -1)
echo "$IMAGE ${id:0:12} $size"
