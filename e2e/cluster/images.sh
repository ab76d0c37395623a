#!/usr/bin/env bash
# Images without a registry.
#   images.sh base      pause, busybox, versitygw and kube-router as hand-made OCI archives
#                       (no daemon needed)
#   images.sh build     the project's images from the same Dockerfiles a laptop uses, with a
#                       private dockerd (--bridge=none --iptables=false) that is stopped after;
#                       the Dockerfiles' base image python:3.11-slim-bookworm is a debootstrap
#                       rootfs (Debian bookworm + python3) imported under that name
#   images.sh import [NAME]  load every built archive (or only NN-NAME.tar) into the
#                       cluster's containerd (k8s.io ns)
#   images.sh spark     the Spark image (spark_image/Dockerfile: Java 17, PySpark, rlog-paxos[spark];
#                       ~1 GB, so not part of `build`/`all`), imported when the cluster runs
#   images.sh release [TAG]  a release's replica and operator images (default TAG: the
#                       previous release, rlog.version.PREVIOUS_RELEASE, found by its tag or
#                       commit: release_source.sh), built from its tree with its own Dockerfiles, tagged with its version
#                       only (never `dev`): what e2e/operator/test_upgrade_release.py upgrades
#                       from; cached by the tag's commit, not part of `build`/`all`, imported
#                       when the cluster runs
# Archives are cached in $CACHE/images, keyed by the content hash of their inputs, so a warm
# run builds nothing and never starts dockerd.
source "$(dirname "$0")/lib.sh"

IMG=$CACHE/images
mkdir -p "$IMG"
PAUSE_IMAGE=registry.k8s.io/pause:3.10
BUSYBOX_IMAGE=docker.io/rlog/busybox:1.35
VERSITYGW_IMAGE=docker.io/rlog/versitygw:dev
BASE_IMAGE=python:3.11-slim-bookworm
BASE_REV=1                       # bump to rebuild the debootstrap base
BASE_TAR=$CACHE/debootstrap-bookworm-python3-$BASE_REV/rootfs.tar
DOCKER_ROOT=$CACHE/docker
DOCKER_RUN=/run/rlog-docker
DOCKER_HOST_SOCK=unix://$DOCKER_RUN/docker.sock
# The project version (rlog.__version__, its one source: docs/upgrades.md, "Versions") in its
# SemVer spelling (rlog.version.semver, as the chart's appVersion: 0.2.0.dev0 -> 0.2.0-dev.0;
# an image tag may not hold '+'): the replica and operator images are tagged with it besides
# `dev`, so the chart's default (its appVersion) and the e2e suites' `dev` name the same
# local build.
semver_of() { # [PEP440-VERSION]: its SemVer spelling (default: this tree's __version__)
  PYTHONPATH=$REPO/replica_image python3 -m rlog.version "$@"
}
RLOG_VERSION=$(semver_of) || die "no SemVer spelling of replica_image/rlog/__init__.py's __version__"
VERSIONED_IMAGES=(docker.io/rlog/rlog-replica docker.io/rlog/rlog-operator)
# name | Dockerfile | context (relative to the repo)
PROJECT_IMAGES=(
  "docker.io/rlog/e2e-smoke:dev|e2e/smoke_image/Dockerfile|e2e/smoke_image"
  "docker.io/rlog/rlog-replica:dev|replica_image/Dockerfile|."
  "docker.io/rlog/rlog-operator:dev|Dockerfile|."
)
# Built and imported only by `images.sh spark` (make e2e-spark-k8s): its archive is not linked
# as NN-*.tar, so `import` and cluster-up do not load it.
SPARK_IMAGES=("docker.io/rlog/rlog-spark:dev|spark_image/Dockerfile|.")

base_images() {
  local psum pbin
  psum=$(sha256sum "$HERE/images/pause.c" | cut -c1-12)
  pbin=$CACHE/pause-$psum/bin/pause
  [[ -x $pbin ]] || "$HERE/build-tools.sh"
  local out=$IMG/pause-$psum.tar
  if [[ ! -f $out ]]; then
    local r; r=$(mktemp -d); cp "$pbin" "$r/pause"
    python3 "$HERE/ociarchive.py" "$r" "$PAUSE_IMAGE" "$out" --entrypoint /pause --user 65535:65535
    rm -rf "$r"; log "image $PAUSE_IMAGE: built"
  fi
  ln -sf "$out" "$IMG/10-pause.tar"
  local bb=/bin/busybox bsum; bsum=$(sha256sum $bb | cut -c1-12)
  out=$IMG/busybox-$bsum.tar
  if [[ ! -f $out ]]; then
    local r; r=$(mktemp -d); mkdir -p "$r/bin" "$r/tmp" "$r/etc"; chmod 1777 "$r/tmp"
    cp $bb "$r/bin/busybox"
    for a in $($bb --list); do [[ $a == busybox ]] || ln -s busybox "$r/bin/$a"; done
    echo 'root:x:0:0:root:/root:/bin/sh' > "$r/etc/passwd"; echo 'root:x:0:' > "$r/etc/group"
    python3 "$HERE/ociarchive.py" "$r" "$BUSYBOX_IMAGE" "$out" --cmd sh
    rm -rf "$r"; log "image $BUSYBOX_IMAGE: built"
  fi
  ln -sf "$out" "$IMG/20-busybox.tar"
  # versitygw: the S3 server of the archive e2e test (e2e/operator/test_backup.py), the
  # static binary e2e/s3/s3.sh builds from the Go module proxy, alone in an image.
  local vbin; vbin=$("$REPO/e2e/s3/s3.sh" build)
  local vsum; vsum=$(sha256sum "$vbin" | cut -c1-12)
  out=$IMG/versitygw-$vsum.tar
  if [[ ! -f $out ]]; then
    local r; r=$(mktemp -d); mkdir -p "$r/bin" "$r/tmp"; chmod 1777 "$r/tmp"
    cp "$vbin" "$r/bin/versitygw"
    python3 "$HERE/ociarchive.py" "$r" "$VERSITYGW_IMAGE" "$out" --entrypoint /bin/versitygw \
      --user 65534:65534
    rm -rf "$r"; log "image $VERSITYGW_IMAGE: built"
  fi
  ln -sf "$out" "$IMG/30-versitygw.tar"
  kube_router_image
}

# kube-router (firewall only, e2e/cluster/manifests/kube-router.yaml): our static build plus
# the host's iptables-nft and ipset, which it runs as commands. The host's own iptables is
# nft-based as well, so the agent's rules and kube-proxy's land in the same tables.
kube_router_image() {
  if [[ $RLOG_NETPOL_AGENT == 0 ]]; then rm -f "$IMG/40-kube-router.tar"; return; fi
  local kr=$KUBE_ROUTER_BIN/kube-router multi=/usr/sbin/xtables-nft-multi ext=/usr/lib/x86_64-linux-gnu/xtables
  [[ -x $kr ]] || "$HERE/build-tools.sh"
  for f in "$multi" /usr/sbin/ipset "$ext/libxt_set.so"; do
    [[ -e $f ]] || die "$f missing: apt-get install iptables ipset (up.sh installs them)"
  done
  local sum; sum=$( { sha256sum "$kr" "$multi" /usr/sbin/ipset "$ext"/*.so
    libs_of "$multi" /usr/sbin/ipset "$ext"/*.so | xargs sha256sum
  } | sha256sum | cut -c1-12)
  local out=$IMG/kube-router-$sum.tar
  if [[ ! -f $out ]]; then
    local r; r=$(mktemp -d); mkdir -p "$r/usr/local/bin" "$r/usr/sbin" "$r/tmp" "$r/run" "$r/etc"
    chmod 1777 "$r/tmp"
    cp "$kr" "$r/usr/local/bin/kube-router"
    # xtables-nft-multi loads its matches and targets (set, physdev, addrtype, ...) from $ext
    copy_with_libs "$r" "$multi" /usr/sbin/ipset "$ext"/*.so
    local n
    for n in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
      ln -s xtables-nft-multi "$r/usr/sbin/$n"
    done
    cp /etc/protocols "$r/etc/protocols"
    python3 "$HERE/ociarchive.py" "$r" "$KUBE_ROUTER_IMAGE" "$out" \
      --entrypoint /usr/local/bin/kube-router
    rm -rf "$r"; log "image $KUBE_ROUTER_IMAGE: built"
  fi
  ln -sf "$out" "$IMG/40-kube-router.tar"
}

# Content hash of a build: the Dockerfile, the base, the CA bundle, and the files its COPY/ADD
# lines take from the context (non-ignored files only; `COPY .` means the whole context).
context_hash() {
  local dockerfile=$1 ctx=$2
  ( cd "$REPO" || exit 1
    mapfile -t srcs < <(awk 'toupper($1) ~ /^(COPY|ADD)$/ && $0 !~ /--from=/ {
        for (i = 2; i < NF; i++) if ($i !~ /^--/) print $i }' "$dockerfile" |
      while read -r s; do echo "$ctx/$s"; done)
    ((${#srcs[@]})) || srcs=("$ctx")
    { echo "base=$BASE_REV version-tag"; sha256sum "$dockerfile" /etc/ssl/certs/ca-certificates.crt
      git ls-files -co --exclude-standard -- "${srcs[@]}" | sort -u |
        while read -r f; do [[ -f $f ]] && sha256sum "$f"; done
    } | sha256sum | cut -c1-16 )
}

debootstrap_base() {
  [[ -f $BASE_TAR ]] && return
  local t=$SECONDS d; d=$(dirname "$BASE_TAR")/rootfs
  log "base image: debootstrap bookworm + python3 (a few minutes)"
  rm -rf "$d"; mkdir -p "$d"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$d" http://deb.debian.org/debian > "$(dirname "$BASE_TAR")/debootstrap.log" 2>&1 ||
    die "debootstrap failed: see $(dirname "$BASE_TAR")/debootstrap.log"
  ln -sf /usr/bin/python3 "$d/usr/local/bin/python3"; ln -sf /usr/bin/python3 "$d/usr/local/bin/python"
  rm -rf "$d"/var/cache/apt/archives/*.deb "$d"/var/lib/apt/lists/*
  tar -C "$d" --numeric-owner -cf "$BASE_TAR.tmp" . && mv "$BASE_TAR.tmp" "$BASE_TAR"
  rm -rf "$d"
  log "base image: built in $((SECONDS - t))s"
}

# The Dockerfiles' base, python:3.11-slim-bookworm, inside our dockerd: the debootstrap
# rootfs, plus this machine's CA bundle (PyPI may be reached through a TLS-inspecting
# proxy whose CA only the host trusts), labelled so that a change of either rebuilds it.
ensure_base_image() {
  local D=(docker -H "$DOCKER_HOST_SOCK") raw=rlog-local/debootstrap-bookworm-python3:$BASE_REV
  local ca=/etc/ssl/certs/ca-certificates.crt want have
  want="$BASE_REV-$(sha256sum "$ca" | cut -c1-12)"
  have=$("${D[@]}" image inspect -f '{{ index .Config.Labels "rlog.base" }}' "$BASE_IMAGE" 2>/dev/null || true)
  [[ $have == "$want" ]] && return
  "${D[@]}" image inspect "$raw" >/dev/null 2>&1 ||
    "${D[@]}" import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' "$BASE_TAR" "$raw" >/dev/null
  local ctx; ctx=$(mktemp -d)
  cp "$ca" "$ctx/ca-certificates.crt"
  cat > "$ctx/Dockerfile" <<DF
FROM $raw
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt PIP_CERT=/etc/ssl/certs/ca-certificates.crt REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
LABEL rlog.base=$want
DF
  DOCKER_BUILDKIT=0 "${D[@]}" build -q -t "$BASE_IMAGE" "$ctx" > "$LOGS/base-image.log" 2>&1 ||
    die "base image build failed: $(tail -5 "$LOGS/base-image.log")"
  rm -rf "$ctx"
  log "base image $BASE_IMAGE ready in dockerd ($want)"
}

# The private dockerd's network flags: no bridge, no iptables/ip6tables rules, no change of
# ip_forward, no masquerading, no userland proxy; builds use --network host. A dockerd with
# its defaults sets the FORWARD policy to DROP, which breaks pod traffic, so one must never
# run beside the cluster. This one may: started beside the running cluster (2026-11-24), it
# left iptables-save, ip6tables-save, `nft list ruleset` (counters aside), the net.ipv4,
# net.ipv6, net.bridge and net.netfilter sysctls, links, addresses, routes and rules exactly
# as they were, during a `docker build --network host`, a `docker run` and after it stopped,
# and a pod fetching from another pod through a Service about once a second saw no failure
# while it ran (docs/local-cluster.md). DOCKERD_EXTRA_ARGS adds flags; the guard below refuses to start a
# dockerd beside the cluster whose flags would let it touch the host's netfilter state.
DOCKERD_NET_FLAGS=(--bridge=none --iptables=false --ip6tables=false --ip-forward=false
  --ip-masq=false --userland-proxy=false)
read -r -a DOCKERD_EXTRA <<<"${DOCKERD_EXTRA_ARGS:-}"

cluster_up() {
  [[ -f $STATE/run/kubelet.pid ]] && kill -0 "$(cat "$STATE/run/kubelet.pid")" 2>/dev/null
}
# Exit 0 when the extra flags leave every network flag above as it is.
dockerd_leaves_netfilter_alone() {
  local a
  for a in "${DOCKERD_EXTRA[@]}"; do
    case $a in
      --bridge*|-b|--iptables*|--ip6tables*|--ip-forward*|--ip-masq*|--userland-proxy*|--bip*|\
      --fixed-cidr*|--default-address-pool*) return 1 ;;
    esac
  done
}

DOCKERD_PID=
dockerd_start() {
  [[ -n $DOCKERD_PID ]] && return
  if cluster_up && ! dockerd_leaves_netfilter_alone; then
    die "the local cluster is up and DOCKERD_EXTRA_ARGS changes dockerd's network flags (${DOCKERD_EXTRA[*]}): a dockerd that touches iptables must not run beside it"
  fi
  mkdir -p "$DOCKER_RUN" "$DOCKER_ROOT"
  # one builder at a time: a second images.sh (another make target) waits for this one
  exec 8>"$CACHE/images.lock"
  flock -w 3600 8 || die "another images.sh held $CACHE/images.lock for an hour"
  dockerd --data-root "$DOCKER_ROOT" --exec-root "$DOCKER_RUN/exec" -H "$DOCKER_HOST_SOCK" \
    --pidfile "$DOCKER_RUN/dockerd.pid" "${DOCKERD_NET_FLAGS[@]}" --storage-driver=overlay2 \
    "${DOCKERD_EXTRA[@]}" > "$DOCKER_RUN/dockerd.log" 2>&1 &
  DOCKERD_PID=$!
  trap dockerd_stop EXIT
  for _ in $(seq 60); do docker -H "$DOCKER_HOST_SOCK" version >/dev/null 2>&1 && return; sleep 0.5; done
  die "dockerd did not start: $(tail -5 "$DOCKER_RUN/dockerd.log")"
}
dockerd_stop() {
  [[ -n $DOCKERD_PID ]] || return 0
  kill "$DOCKERD_PID" 2>/dev/null || true
  for _ in $(seq 60); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.5; done
  kill -9 "$DOCKERD_PID" 2>/dev/null || true
  DOCKERD_PID=
  # its containerd and shims are its children and exit with it; leave no mounts behind
  awk -v a="$DOCKER_RUN" -v b="$DOCKER_ROOT/" 'index($2, a) == 1 || index($2, b) == 1 {print $2}' /proc/mounts |
    sort -r | xargs -r -n1 umount -l 2>/dev/null || true
  for d in /sys/fs/cgroup/*/docker; do [[ -d $d ]] && find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null; done
  exec 8>&-
  log "dockerd stopped"
}

build_images() {
  local strict=${1:-1} spec name df ctx h out failed=0 specs=("${PROJECT_IMAGES[@]}")
  [[ ${2:-} == spark ]] && specs=("${SPARK_IMAGES[@]}")
  for spec in "${specs[@]}"; do
    IFS='|' read -r name df ctx <<<"$spec"
    local short=${name##*/}; short=${short%%:*}
    if [[ ! -f $REPO/$df ]] || { [[ $ctx == . ]] && [[ ! -f $REPO/pyproject.toml ]]; }; then
      log "image $name: skipped ($df or pyproject.toml missing)"; rm -f "$IMG/50-$short.tar"; continue
    fi
    h=$(context_hash "$df" "$ctx"); out=$IMG/$short-$h.tar
    [[ -f $out ]] && log "image $name: cached ($h)"
    if [[ ! -f $out ]]; then
      debootstrap_base; dockerd_start
      local D=(docker -H "$DOCKER_HOST_SOCK")
      ensure_base_image
      local t=$SECONDS
      local names=("$name") repo=${name%:*} v
      for v in "${VERSIONED_IMAGES[@]}"; do
        if [[ $repo == "$v" ]]; then names+=("$repo:$RLOG_VERSION"); fi
      done
      log "image ${names[*]}: docker build -f $df $ctx"
      if DOCKER_BUILDKIT=0 "${D[@]}" build --network host -q -f "$REPO/$df" "${names[@]/#/--tag=}" "$REPO/$ctx" \
          > "$IMG/$short.build.log" 2>&1 && "${D[@]}" save -o "$out.tmp" "${names[@]}" 2>> "$IMG/$short.build.log"; then
        mv "$out.tmp" "$out"; log "image $name: built in $((SECONDS - t))s"
        find "$IMG" -maxdepth 1 -name "$short-*.tar" ! -path "$out" -delete   # keep the newest only
      else
        rm -f "$out.tmp" "$IMG/50-$short.tar"; failed=1
        log "image $name: BUILD FAILED, see $IMG/$short.build.log"
        tail -20 "$IMG/$short.build.log" >&2; continue
      fi
    fi
    if [[ ${2:-} == spark ]]; then ln -sf "$out" "$IMG/spark-$short.tar"; else ln -sf "$out" "$IMG/50-$short.tar"; fi
  done
  [[ -n $DOCKERD_PID ]] && docker -H "$DOCKER_HOST_SOCK" image prune -f >/dev/null 2>&1 || true
  dockerd_stop
  ((failed == 0 || strict == 0)) || die "some images failed to build"
}

# A release's images, e.g. v0.1.0's docker.io/rlog/rlog-replica:0.1.0 and rlog-operator:0.1.0:
# the tag's tree (`git archive`, tracked files only) built with its own Dockerfiles, as its
# `images.sh build` would have, and tagged with its version's SemVer spelling (as its chart's
# appVersion) and nothing else, so that no `dev` of this tree is replaced. The archives are
# keyed by the tag's commit and the base image's revision: a warm run builds nothing.
RELEASE_IMAGES=("docker.io/rlog/rlog-replica|replica_image/Dockerfile"
  "docker.io/rlog/rlog-operator|Dockerfile")
release_images() { # [TAG]
  local tag=${1:-} commit version spec repo df short out tree="" failed=0 rc=0
  if [[ -n $tag ]]; then
    commit=$(git -C "$REPO" rev-parse -q --verify "refs/tags/$tag^{commit}") ||
      die "no git tag $tag in $REPO: git fetch origin tag $tag"
  else
    # the previous release: its tag or, in a clone without tags, its commit
    tag=$(PYTHONPATH=$REPO/replica_image python3 -m rlog.version --previous-release) ||
      die "no previous release in replica_image/rlog/version.py"
    commit=$(bash "$HERE/release_source.sh" commit) || rc=$?
    if ((rc == 3)); then # the tests that need it skip, naming the same reason
      log "WARNING: $tag's images not built: this clone cannot have its source"; return 0
    fi
    ((rc == 0)) || die "the previous release's commit: see above"
  fi
  version=$(git -C "$REPO" show "$commit:replica_image/rlog/__init__.py" |
    sed -n 's/^__version__ = "\(.*\)"$/\1/p')
  version=$(semver_of "$version") || die "$tag: no SemVer spelling of its __version__"
  local built=()
  for spec in "${RELEASE_IMAGES[@]}"; do
    IFS='|' read -r repo df <<<"$spec"
    short=${repo##*/}
    out=$IMG/release-$short-${commit:0:12}-base$BASE_REV.tar
    if [[ -f $out ]]; then log "image $repo:$version ($tag): cached"; built+=("$out"); continue; fi
    if [[ -z $tree ]]; then
      tree=$CACHE/build/release-tree   # the tag's files (emptied first: a failed run's left)
      rm -rf "$tree"; mkdir -p "$tree"
      git -C "$REPO" archive "$commit" | tar -x -C "$tree" || die "git archive $tag failed"
    fi
    [[ -f $tree/$df ]] || die "$tag has no $df"
    debootstrap_base; dockerd_start
    local D=(docker -H "$DOCKER_HOST_SOCK") t=$SECONDS
    ensure_base_image
    log "image $repo:$version ($tag, ${commit:0:12}): docker build -f $df"
    if DOCKER_BUILDKIT=0 "${D[@]}" build --network host -q -f "$tree/$df" --tag="$repo:$version" "$tree" \
        > "$IMG/release-$short.build.log" 2>&1 &&
        "${D[@]}" save -o "$out.tmp" "$repo:$version" 2>> "$IMG/release-$short.build.log"; then
      mv "$out.tmp" "$out"; log "image $repo:$version: built in $((SECONDS - t))s"
      # one release at a time: the previous release's archive only
      find "$IMG" -maxdepth 1 -name "release-$short-*.tar" ! -path "$out" -delete
      built+=("$out")
    else
      rm -f "$out.tmp"; failed=1
      log "image $repo:$version: BUILD FAILED, see $IMG/release-$short.build.log"
      tail -20 "$IMG/release-$short.build.log" >&2
    fi
  done
  [[ -n $tree ]] && rm -rf "$tree"
  [[ -n $DOCKERD_PID ]] && docker -H "$DOCKER_HOST_SOCK" image prune -f >/dev/null 2>&1 || true
  dockerd_stop
  ((failed == 0)) || die "some images of $tag failed to build"
  if cluster_up && [[ -S $CTRD_SOCK ]]; then
    local f
    for f in "${built[@]}"; do
      ctr -a "$CTRD_SOCK" -n k8s.io images import "$f" >/dev/null || die "import of $f failed"
    done
    log "images of $tag imported: ${RELEASE_IMAGES[*]%%|*} (tag $version)"
  fi
}

# Exit 0 (and name them) if some project image in the cluster is older than this tree.
stale_images() {
  local spec name df ctx short h stale=1
  for spec in "${PROJECT_IMAGES[@]}"; do
    IFS='|' read -r name df ctx <<<"$spec"
    [[ -f $REPO/$df ]] || continue
    short=${name##*/}; short=${short%%:*}
    h=$(context_hash "$df" "$ctx")
    if [[ $(readlink "$IMG/50-$short.tar" 2>/dev/null) != "$IMG/$short-$h.tar" ]]; then
      log "image $name is older than this tree"; stale=0
    fi
  done
  return $stale
}

import_images() { # [NAME]: only the archive NN-NAME.tar
  local ctr=(ctr -a "$CTRD_SOCK" -n k8s.io) f
  for f in "$IMG"/[0-9]*"${1:+-$1}".tar; do
    [[ -e $f ]] || continue
    "${ctr[@]}" images import "$f" >/dev/null || die "import of $f failed"
  done
  log "images imported: $("${ctr[@]}" images ls -q | grep -v '^sha256:' | tr '\n' ' ')"
}

# The Spark image is 1.2 GB: importing it again takes minutes, so it is imported only when
# containerd does not hold this very archive's image (a stamp names the archive and the
# digest containerd gave it; a new cluster or a rebuilt image does not match).
SPARK_REF=docker.io/rlog/rlog-spark:dev
spark_digest() {
  ctr -a "$CTRD_SOCK" -n k8s.io images ls "name==$SPARK_REF" 2>/dev/null | awk 'NR > 1 {print $3}'
}

import_spark_image() {
  local archive stamp=$IMG/spark-rlog-spark.imported t=$SECONDS
  archive=$(readlink -f "$IMG/spark-rlog-spark.tar") || die "no Spark image archive"
  if [[ -n $(spark_digest) && $(cat "$stamp" 2>/dev/null) == "$archive $(spark_digest)" ]]; then
    log "image $SPARK_REF: already imported (${archive##*/})"; return
  fi
  ctr -a "$CTRD_SOCK" -n k8s.io images import "$archive" >/dev/null ||
    die "import of the Spark image failed"
  echo "$archive $(spark_digest)" > "$stamp"
  log "image $SPARK_REF imported in $((SECONDS - t))s"
}

case ${1:-all} in
  base) base_images ;;
  build) base_images; build_images "${2:-1}" ;;
  import) import_images "${2:-}" ;;
  stale) stale_images ;;
  debootstrap) debootstrap_base ;;
  spark) build_images 1 spark
         if cluster_up; then import_spark_image; fi ;;
  release) release_images "${2:-}" ;;
  all) base_images; build_images 1
       if [[ -S $CTRD_SOCK ]]; then import_images; fi ;;
  *) die "usage: images.sh base|build [strict]|import [NAME]|stale|debootstrap|spark|release [TAG]|all" ;;
esac
