#!/usr/bin/env bash
# Writes CHANGELOG.rst and changelogs/changelog.yaml from the fragments
# (`make changelog`), or checks that they are up to date (in `make lint`).
# Usage: tools/changelog.sh update|check
# The version of galaxy.yml is not released yet. Its entry is written anew
# from the fragments each time, with the date it was first written, so the
# fragments stay (keep_fragments: true in changelogs/config.yaml).
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(awk '/^version:/ {print $2}' galaxy.yml)

release() {
  # Takes the version's entry out, keeping its date, and writes it anew.
  local date
  date=$(python3 - "$version" <<'PY'
import datetime, sys, yaml
path = "changelogs/changelog.yaml"
changes = yaml.safe_load(open(path))
entry = (changes.get("releases") or {}).pop(sys.argv[1], {})
yaml.safe_dump(changes, open(path, "w"), default_flow_style=False, sort_keys=True)
print(entry.get("release_date") or datetime.date.today().isoformat())
PY
)
  antsibull-changelog release --version "$version" --date "$date"
}

# Both work in a copy of the files git knows (untracked ones too, not the
# ignored): antsibull-changelog copies the tree to read the plugins' docs,
# and the ignored .cache holds venvs whose links point into containers.
case ${1:-} in
  update|check) ;;
  *) echo "usage: tools/changelog.sh update|check" >&2; exit 2 ;;
esac
files=(CHANGELOG.rst changelogs/changelog.yaml)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$tmp"
(cd "$tmp" && release >/dev/null)

case ${1:-} in
  update)
    for file in "${files[@]}"; do cp "$tmp/$file" "$file"; done
    ;;
  check)
    for file in "${files[@]}"; do
      diff -u "$file" "$tmp/$file" || { echo "$file is not what the fragments say: run make changelog" >&2; exit 1; }
    done
    echo "changelog: up to date"
    ;;
esac
