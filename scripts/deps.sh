#!/usr/bin/env bash
# Installs the Debian packages the tests use, when they are missing:
# etcd-server (the external etcd of the control-plane tests) and
# python3-torch (the torchrun DDP client under gpucoord launch) and
# iptables (the cluster-in-a-box tests cut hosts off with it) and openssl
# (s_client shows what a coordinator's port speaks) and prometheus (it
# scrapes a coordinator for the Grafana dashboard's test) and slurm-wlm and
# munge (testcluster's Slurm cluster in a box: slurmctld, slurmd, srun) and
# buildah, podman and runc (make image, and the test that runs the image:
# runc, since crun refuses a cgroup v1 machine whose v2 hierarchy holds a
# controller) and chromium (the dashboard's tests drive it headless through
# the DevTools protocol).
set -euo pipefail
need=()
[ -x /usr/bin/etcd ] || need+=(etcd-server)
/usr/bin/python3 -c 'import torch' >/dev/null 2>&1 || need+=(python3-torch)
command -v iptables >/dev/null 2>&1 || [ -x /usr/sbin/iptables ] || need+=(iptables)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
[ -x /usr/bin/prometheus ] || need+=(prometheus)
{ [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && [ -x /usr/bin/srun ]; } || need+=(slurm-wlm)
[ -x /usr/sbin/munged ] || need+=(munge)
command -v buildah >/dev/null 2>&1 || need+=(buildah)
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v runc >/dev/null 2>&1 || need+=(runc)
[ -x /usr/bin/chromium ] || need+=(chromium)
[ ${#need[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" = 0 ] || sudo=sudo
echo "installing ${need[*]} with apt-get"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}"
