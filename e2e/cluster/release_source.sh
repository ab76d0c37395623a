#!/usr/bin/env bash
# The previous release's source, for the tests that run this tree against it
# (tests/runtime/test_mixed_release_live.py, e2e/operator/test_upgrade_release.py and
# `images.sh release`): one place decides which commit that is and how to get it.
#   release_source.sh commit            print the release's commit
#   release_source.sh archive PATH...   a tar of those paths at that commit, on stdout
# Exit 3 (with the reason on stderr) when this clone cannot have it: a shallow clone without
# the commit and no remote to fetch it from. Callers skip then, saying so; any other failure
# is an error.
#
# The release is named twice in replica_image/rlog/version.py: its tag (PREVIOUS_RELEASE) and
# its commit (PREVIOUS_RELEASE_COMMIT). A tag alone is not enough: `git push` and
# `git clone --no-tags` leave tags behind, while the commit is in every full clone's history
# (a tag-only lookup made CI fail on a clone without tags). Where both are present they must
# agree: a moved tag is an error, never a silent switch of what the tests run against.
source "$(dirname "$0")/lib.sh"

release_info() { # prints "TAG COMMIT"
  PYTHONPATH=$REPO/replica_image python3 -c \
    'from rlog.version import PREVIOUS_RELEASE as t, PREVIOUS_RELEASE_COMMIT as c; print(t, c)'
}

release_commit() {
  local tag want tagged
  read -r tag want < <(release_info) || die "no previous release in replica_image/rlog/version.py"
  tagged=$(git -C "$REPO" rev-parse -q --verify "refs/tags/$tag^{commit}" 2>/dev/null) || tagged=""
  if [[ -n $tagged ]]; then
    [[ $tagged == "$want" ]] ||
      die "git tag $tag is $tagged but replica_image/rlog/version.py says $want: which is the release?"
    echo "$want"; return 0
  fi
  if git -C "$REPO" cat-file -e "$want^{commit}" 2>/dev/null; then echo "$want"; return 0; fi
  # a shallow clone: fetch that one commit if there is a remote to ask
  if [[ $(git -C "$REPO" rev-parse --is-shallow-repository) == true ]] &&
      git -C "$REPO" remote get-url origin >/dev/null 2>&1 &&
      git -C "$REPO" fetch -q --depth=1 origin "$want" >&2 &&
      git -C "$REPO" cat-file -e "$want^{commit}" 2>/dev/null; then
    echo "$want"; return 0
  fi
  echo "this clone has neither git tag $tag nor its commit $want" \
    "(shallow: $(git -C "$REPO" rev-parse --is-shallow-repository), no remote could give it):" \
    "git fetch origin tag $tag" >&2
  return 3
}

case ${1:-} in
  commit) release_commit ;;
  archive)
    shift; (($# > 0)) || die "usage: release_source.sh archive PATH..."
    commit=$(release_commit) || exit $?
    git -C "$REPO" archive "$commit" -- "$@" ;;
  *) die "usage: release_source.sh commit|archive PATH..." ;;
esac
