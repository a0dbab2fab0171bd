#!/usr/bin/env bash
# Install, upgrade, roll back or remove the appliance, offline, from this bundle. As root:
#
#   ./install.sh [--pubkey FILE [--replace-key]] [--no-start]   install, or upgrade to it
#   ./install.sh --rollback                      back to the release that was current before
#   ./install.sh --uninstall [--purge [--yes]]   remove it; store, key and configuration stay
#                                                unless --purge
#   --root DIR                                   all of it under DIR as if it were / (trials and
#                                                tests): systemd is left alone
#
# Nothing is downloaded. The bundle is checked first: every file against SHA256SUMS, no file
# unlisted, and the Ed25519 signature of SHA256SUMS (openssl) with --pubkey, or with the key an
# earlier install was given (kept as /etc/appliance/bundle-signing.pub; another --pubkey is
# refused unless --replace-key says that the signing key changed on purpose). Each release is its
# own virtual environment, /opt/appliance/releases/<release>, installed from the wheelhouse
# with pip --no-index --require-hashes --no-deps -r requirements.lock; /opt/appliance/current
# is switched by renaming a new symlink over it, so it always names a complete release, and
# /opt/appliance/previous keeps the one before for --rollback. The store (/var/lib/appliance),
# the master key (/etc/credstore/appliance.master.key) and the configuration (/etc/appliance)
# are created once and never replaced. Then the unit is enabled and (re)started, or, where
# systemd does not run, the commands to do so are printed; last, 'appliance doctor' checks it all.
set -euo pipefail
umask 022

bundle=$(cd "$(dirname "$0")" && pwd)
root=""
action=install
pubkey=""
start=yes
purge=no
confirmed=no
replace_key=no

say() { echo "install.sh: $*"; }
die() {
    echo "install.sh: error: $1" >&2
    [[ -z ${2:-} ]] || echo "  hint: $2" >&2
    exit 1
}
usage() { sed -n '2,10s/^# \{0,1\}//p' "$0"; }

while (($#)); do
    case $1 in
        --root) root=$(realpath -m "${2:?--root needs a directory}"); shift ;;
        --pubkey)
            [[ -f ${2:-} ]] || die "--pubkey needs the public key file, and '${2:-}' is none" \
                "give the .pub file that 'build-bundle --make-key' wrote beside the signing key"
            pubkey=$(realpath "$2")
            shift
            ;;
        --replace-key) replace_key=yes ;;
        --no-start) start=no ;;
        --rollback) action=rollback ;;
        --uninstall) action=uninstall ;;
        --purge) purge=yes ;;
        --yes) confirmed=yes ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; die "unknown option $1" ;;
    esac
    shift
done
[[ $purge == no || $action == uninstall ]] || die "--purge goes with --uninstall"
[[ $(id -u) == 0 ]] || die "install.sh must run as root" "sudo $0"

opt=$root/opt/appliance
etc=$root/etc/appliance
state=$root/var/lib/appliance
key=$root/etc/credstore/appliance.master.key
units=$root/etc/systemd/system
dropins=$units/appliance.service.d
sysusers=$root/etc/sysusers.d/appliance.conf
tmpfiles=$root/etc/tmpfiles.d/appliance.conf
trusted=$etc/bundle-signing.pub
commands=()  # systemctl commands to run by hand, where systemd does not run here

systemctl_() {
    if [[ -z $root && -d /run/systemd/system ]]; then
        systemctl "$@"
    else
        commands+=("systemctl $*")
    fi
}

# The installed CLI; under --root pointed at the files there instead of the configured paths.
appliance() {
    if [[ -n $root ]]; then
        APPLIANCE_CONFIG=$etc/appliance.toml APPLIANCE_STATE_DIR=$state APPLIANCE_KEYS_FILE=$key \
            APPLIANCE_DAEMON_SOCKET=$root/run/appliance/appliance.sock "$opt/current/bin/appliance" "$@"
    else
        "$opt/current/bin/appliance" "$@"
    fi
}

# -- checking the bundle ------------------------------------------------------------------

verify_bundle() {
    [[ -f $bundle/SHA256SUMS && -f $bundle/RELEASE ]] \
        || die "$bundle is not an appliance bundle: no SHA256SUMS or RELEASE" "run the install.sh of an unpacked bundle"
    [[ -d $bundle/wheelhouse ]] || die "this install.sh is an installed copy, without the wheelhouse" \
        "it can --rollback and --uninstall; to install, run the install.sh of an unpacked bundle"
    cd "$bundle"
    local with=${pubkey:-}
    if [[ -n $with && -f $trusted && $replace_key == no ]] && ! cmp -s "$with" "$trusted"; then
        die "--pubkey $with is not the key earlier bundles were checked with ($trusted)" \
            "whoever brings a changed bundle can bring a key for it too: replace the trusted key only on purpose,"\
" with --replace-key, once the new key came from its owner another way"
    fi
    [[ -n $with || ! -f $trusted ]] || with=$trusted
    if [[ -n $with ]]; then
        [[ -f SHA256SUMS.sig ]] || die "the bundle is not signed, but $with expects a signature" \
            "install a signed bundle; install nothing from this one"
        command -v openssl >/dev/null || die "openssl is needed to check the bundle's signature" "apt-get install openssl"
        openssl pkeyutl -verify -pubin -inkey "$with" -rawin -in SHA256SUMS -sigfile SHA256SUMS.sig >/dev/null 2>&1 \
            || die "the bundle's signature does not verify with $with: it was changed, or signed with another key" \
                "get the bundle again from where it was built; install nothing from this one"
        say "the signature of SHA256SUMS verifies with $with"
    else
        say "no public key given: checking checksums only (--pubkey FILE checks the signature too)"
    fi
    local failed unlisted
    if ! failed=$(sha256sum --check --strict --quiet SHA256SUMS 2>&1); then
        die "the bundle is damaged or was changed: $(echo "$failed" | grep -v WARNING | head -3 | paste -sd ' ')" \
            "copy the bundle again from where it was built; install nothing from this one"
    fi
    unlisted=$(comm -13 <(sed 's/^[0-9a-f]*  //' SHA256SUMS | sort) \
        <(find . -type f ! -name SHA256SUMS ! -name SHA256SUMS.sig -printf '%P\n' | sort))
    [[ -z $unlisted ]] || die "the bundle holds files SHA256SUMS does not list: $(echo "$unlisted" | head -3 | paste -sd ' ')" \
        "copy the bundle again from where it was built; install nothing from this one"
    say "all $(wc -l <SHA256SUMS) files match SHA256SUMS"
}

release_field() { sed -n "s/^$1=//p" "$bundle/RELEASE"; }

find_python() {
    local candidate version
    for candidate in python3.11 python3; do
        command -v "$candidate" >/dev/null || continue
        version=$("$candidate" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
        if [[ $version == "$(release_field python)" ]]; then
            command -v "$candidate"
            return
        fi
    done
    die "the bundle's wheels are for Python $(release_field python), which this machine does not have" \
        "install it from the distribution's packages (Debian 12: python3)"
}

# -- installing ---------------------------------------------------------------------------

install_release() {
    local release=$1 python=$2 dest=$opt/releases/$1 pip
    if [[ -f $dest/.installed ]]; then
        say "release $release is installed already"
        return
    fi
    rm -rf "$dest" # what an interrupted install left
    mkdir -p "$opt/releases"
    say "installing release $release ($(release_field variant), torch $(release_field torch)) into $dest"
    "$python" -m venv --without-pip "$dest"
    pip=$(compgen -G "$bundle/wheelhouse/pip-*.whl")
    # pip runs from its wheel, and ignores this machine's pip configuration: only the bundle counts.
    PIP_CONFIG_FILE=/dev/null "$dest/bin/python" "$pip/pip" install --isolated --quiet --disable-pip-version-check \
        --no-index --find-links "$bundle/wheelhouse" --require-hashes --no-deps --no-compile \
        --requirement "$bundle/requirements.lock"
    # Compiled now, on every core, since the service cannot write into its read-only release. Like
    # pip, this skips the few files that are not Python 3.11 (torch ships one for 3.12).
    "$dest/bin/python" -m compileall -q -j 0 "$dest/lib" >/dev/null 2>&1 || true
    "$dest/bin/appliance" version >/dev/null
    mkdir "$dest/bundle"
    cp -a "$bundle/install.sh" "$bundle/RELEASE" "$bundle/SHA256SUMS" "$bundle/requirements.lock" \
        "$bundle/packaging" "$dest/bundle/"
    touch "$dest/.installed"
}

setup_system() {
    local python=$1
    if ! command -v systemd-sysusers >/dev/null || ! command -v systemd-tmpfiles >/dev/null; then
        die "systemd's tools (systemd-sysusers, systemd-tmpfiles) are needed" "apt-get install systemd"
    fi
    install -D -m 0644 "$bundle/packaging/sysusers.conf" "$sysusers"
    install -D -m 0644 "$bundle/packaging/tmpfiles.conf" "$tmpfiles"
    systemd-sysusers ${root:+--root="$root"} "$sysusers"
    systemd-tmpfiles --create ${root:+--root="$root"} "$tmpfiles"
    if [[ -f $etc/appliance.toml ]]; then
        say "keeping the configuration $etc/appliance.toml"
    else
        install -D -m 0644 "$bundle/packaging/appliance.toml" "$etc/appliance.toml"
        say "wrote the configuration $etc/appliance.toml"
    fi
    if [[ -n $pubkey ]]; then
        install -m 0644 "$pubkey" "$trusted"
        say "later bundles must be signed with the key $pubkey (kept as $trusted)"
    fi
    if [[ ! -f $key ]]; then
        [[ ! -e $state/appliance.db ]] || die "a store exists at $state/appliance.db but there is no master key at $key" \
            "restore the key from its backup to $key (mode 0600): a new key could not open that store"
        "$python" -c 'import sys; from pathlib import Path; from appliance.store import keys
keys.write_key_file(Path(sys.argv[1]), keys.generate())' "$key"
        say "created the master key $key (mode 0600); back it up: without it nothing in the store can be read"
    fi
}

# Before a release that migrates the store to a newer schema, a copy of the store as it is, so
# that a rollback has a database the older release can read.
copy_store_before_migration() {
    local release=$1 copy=appliance.db.before-$1
    [[ -f $state/appliance.db && ! -e $state/$copy ]] || return 0
    # SQLite's backup API in one step: a consistent copy while the service may still be writing
    # (a stepwise backup starts over at every write another connection makes). Made in a folder
    # of root's, then written into the state directory through a new file opened there with
    # O_EXCL|O_NOFOLLOW and chowned by its descriptor: the directory is the service user's, who
    # could put a link (to /etc/shadow, say) where root would otherwise write or chown by name.
    "$opt/releases/$release/bin/python" - "$state/appliance.db" "$copy" "$opt" <<'PY' \
        || die "could not copy the store before release $release migrates it (above: why)" \
            "a full disk is the usual cause (the copy is made in $opt, then in $state): free space, then run this again"
import os
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path

from appliance.store import db, migrations

store, name, staging = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
source = db.connect_read_only(store)
if migrations.current_version(source) < migrations.LATEST:
    state = os.open(store.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    owner = os.fstat(state)
    with tempfile.TemporaryDirectory(dir=staging) as private:
        staged = Path(private) / name
        with sqlite3.connect(staged) as copy:
            source.conn.backup(copy)
            copy.execute("PRAGMA journal_mode = DELETE")
        copy.close()
        made = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=state)
        os.fchown(made, owner.st_uid, owner.st_gid)
        with staged.open("rb") as data, os.fdopen(made, "wb") as out:
            shutil.copyfileobj(data, out, 2**20)
            out.flush()
            os.fsync(out.fileno())
PY
    [[ ! -e $state/$copy ]] || say "release $release migrates the store at its first start; the store as it was: $state/$copy"
}

# Point current at releases/$1 (rename over the old link: never a moment without one) and
# previous at what current was; releases that are neither go.
switch_to() {
    local new=releases/$1 old dir
    old=$(readlink "$opt/current" || true)
    if [[ $old != "$new" ]]; then
        ln -sfn "$new" "$opt/.current.new" && mv -T "$opt/.current.new" "$opt/current"
        if [[ -n $old ]]; then
            ln -sfn "$old" "$opt/.previous.new" && mv -T "$opt/.previous.new" "$opt/previous"
        fi
    fi
    for dir in "$opt"/releases/*; do
        [[ releases/${dir##*/} == "$new" || releases/${dir##*/} == "$(readlink "$opt/previous" || true)" ]] || rm -rf "$dir"
    done
    if ! { mkdir -p "$root/usr/local/bin" && ln -sfn /opt/appliance/current/bin/appliance "$root/usr/local/bin/appliance"; } \
        2>/dev/null; then
        say "could not link $root/usr/local/bin/appliance (a read-only /usr?): the CLI is /opt/appliance/current/bin/appliance"
    fi
}

# The unit and its drop-ins, from the current release: its MemoryMax from the configuration,
# and access to GPU device nodes only where there are some.
install_units() {
    local packaging=$opt/current/bundle/packaging memory
    install -D -m 0644 "$packaging/appliance.service" "$units/appliance.service"
    mkdir -p "$dropins"
    memory=$("$opt/current/bin/python" - "$etc/appliance.toml" <<'PY'
import sys

from appliance.core import config
from appliance.core.errors import ConfigError

try:
    print(config.load(sys.argv[1]).daemon.memory_max)
except ConfigError as exc:
    sys.exit(f"install.sh: error: {exc.message}" + (f"\n  hint: {exc.hint}" if exc.hint else ""))
PY
    )
    cat >"$dropins/memory.conf" <<EOF
# Written by install.sh from daemon.memory_max in /etc/appliance/appliance.toml; run install.sh
# again after changing it.
[Service]
# The daemon, its job processes and all they load share this; above it the kernel kills the
# largest process of the service, normally a job, and the daemon goes on (OOMPolicy=continue).
MemoryMax=$memory
EOF
    gpu_dropin nvidia "$root"/dev/nvidiactl
    gpu_dropin dri "$root"/dev/dri/renderD*
}

gpu_dropin() {
    local kind=$1
    shift
    if [[ -e $1 ]]; then
        install -m 0644 "$opt/current/bundle/packaging/gpu-$kind.conf" "$dropins/gpu-$kind.conf"
        say "GPU device nodes found ($1): the service may use them (gpu-$kind.conf)"
    else
        rm -f "$dropins/gpu-$kind.conf"
    fi
}

start_service() {
    systemctl_ daemon-reload
    systemctl_ enable appliance.service
    [[ $start == no ]] || systemctl_ restart appliance.service \
        || die "the service did not start with release $(readlink "$opt/current")" \
            "'journalctl -u appliance' says why; '/opt/appliance/current/bundle/install.sh --rollback' goes back to the release before"
    if ((${#commands[@]})); then
        if [[ -n $root ]]; then
            say "installed under $root; systemd was left alone. Where it runs, as root:"
        else
            say "systemd is not running here (no /run/systemd/system). Where it runs, as root:"
        fi
        printf '  %s\n' "${commands[@]}"
    fi
}

run_doctor() {
    say "checking the installation with 'appliance doctor':"
    appliance doctor || die "installed, but 'appliance doctor' found problems (above)" \
        "fix them and run 'appliance doctor' again, or go back to the release before with '$opt/current/bundle/install.sh --rollback'"
}

install_bundle() {
    verify_bundle
    local release python
    release=$(release_field release)
    [[ $release =~ ^[A-Za-z0-9._+-]+$ ]] || die "the bundle names no valid release: '$release'"
    python=$(find_python)
    install_release "$release" "$python"
    setup_system "$opt/releases/$release/bin/python"
    copy_store_before_migration "$release"
    switch_to "$release"
    install_units
    say "release $release is current"
    start_service
    run_doctor
}

rollback() {
    local previous current
    previous=$(readlink "$opt/previous" || true)
    current=$(readlink "$opt/current" || true)
    [[ -n $previous && -f $opt/$previous/.installed ]] \
        || die "there is no previous release to roll back to" "'ls $opt/releases' shows what is installed"
    switch_to "${previous#releases/}"
    install_units
    say "rolled back from ${current#releases/} to ${previous#releases/}"
    if [[ -e $state/appliance.db.before-${current#releases/} ]]; then
        say "${current#releases/} may have migrated the store beyond what ${previous#releases/} reads; if"
        say "'appliance doctor' says so, stop the service and copy $state/appliance.db.before-${current#releases/}"
        say "over $state/appliance.db (what changed since the upgrade is lost)"
    fi
    start_service
    run_doctor
}

uninstall() {
    if [[ $purge == yes && $confirmed == no ]]; then
        [[ -t 0 ]] || die "--purge deletes the store and the master key for good" "add --yes to confirm"
        local answer
        read -r -p "delete the store, the master key and the configuration for good? type 'purge': " answer
        [[ $answer == purge ]] || die "nothing was removed"
    fi
    [[ ! -f $units/appliance.service ]] || systemctl_ disable --now appliance.service
    rm -rf "$units/appliance.service" "$dropins" "$sysusers" "$tmpfiles" "$root/usr/local/bin/appliance" "$opt"
    systemctl_ daemon-reload
    if [[ $purge == yes ]]; then
        rm -rf "$state" "$root/var/log/appliance" "$root/var/cache/appliance" "$etc" "$key"
        say "removed the appliance, its store, master key and configuration. The system user 'appliance'"
        say "stays (its id could otherwise pass to a new user and with it any file left behind): 'userdel appliance'"
    else
        say "removed the appliance; kept the store ($state), the master key ($key) and the configuration"
        say "($etc): installing again picks them up; --uninstall --purge removes them"
    fi
    if ((${#commands[@]})); then
        say "systemd is not running here; where it runs, as root:"
        printf '  %s\n' "${commands[@]}"
    fi
}

mkdir -p "$root/etc"
exec 9<"$root/etc"
flock --nonblock 9 || die "another install.sh is running" "wait for it to finish"
case $action in
    install) install_bundle ;;
    rollback) rollback ;;
    uninstall) uninstall ;;
esac
