"""Make a container a host that deploys itself with ansible-pull, as a user's
host would be: git, ansible-core and the collection installed, a git
repository to pull from. The containers reach no network, so this machine
downloads what a host needs, with the ordinary clients, and copies it in:

- Debian's packages, with this machine's apt-get but the host's own sources,
  keys and dpkg status, so that apt picks exactly what the host lacks, in the
  host's release. The host installs them with its own apt-get, offline.
- on Debian 11, the wheels of ansible-core 2.15 (pull-debian11.txt). Debian 11
  has Python 3.9 and ansible-core 2.10 (too old), and ansible-core 2.16 and
  later need Python 3.10 on the controller, which ansible-pull's host is. pip
  downloads the pinned wheels for Python 3.9, and the host installs them into
  a venv with the pip of Debian's python3-venv, offline.
- on Debian 13, Debian's own ansible-core (2.19).

Used by test_pull.py and benchmarks/pull.sh:
    python3 pull_host.py CONTAINER TARBALL CACHE_DIR    prints ansible's bin folder on the host
"""

import os
import pathlib
import subprocess
import sys
import tarfile
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
# What each Debian release needs beyond a bare host (systemd and python3),
# and where ansible-pull is then. Debian 12's ansible-core is 2.14, too old
# for the collection; it would take pip's, as Debian 11 does.
RELEASES = {
    "bullseye": {"packages": ["git", "python3-venv"], "wheels": HERE.parent / "pull-debian11.txt",
                 "python": "3.9", "bin": "/opt/ansible-pull/bin"},
    "trixie": {"packages": ["git", "ansible-core"], "bin": "/usr/bin"},
}
# Where the host keeps what was copied in, and the collection for every user.
INBOX = "/var/cache/batchq-pull"
COLLECTIONS = "/usr/share/ansible/collections"


def run(*command, check=True):
    return subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=check)


def on_host(container, command, check=True):
    """Run a shell command on the host; returns (returncode, output)."""
    done = run("docker", "exec", container, "sh", "-c", command, check=False)
    if check and done.returncode != 0:
        raise AssertionError("%s on %s failed (%s):\n%s" % (command, container, done.returncode, done.stdout))
    return done.returncode, done.stdout


def copy_in(container, files, folder):
    """Copy files of this machine into folder on the host (created), through tar on docker exec."""
    on_host(container, "mkdir -p '%s'" % folder)
    with tempfile.TemporaryFile() as archive:
        with tarfile.open(fileobj=archive, mode="w") as tar:
            for path in files:
                tar.add(str(path), arcname=pathlib.Path(path).name)
        archive.seek(0)
        subprocess.run(["docker", "exec", "-i", container, "tar", "-x", "-C", folder], stdin=archive, check=True,
                       stdout=subprocess.DEVNULL)


def release_of(container):
    return on_host(container, ". /etc/os-release && echo $VERSION_CODENAME")[1].strip()


def debian_packages(container, packages, cache):
    """Download what the host needs of packages, with this machine's apt-get
    and the host's sources, keys and dpkg status; returns the .deb files."""
    root = pathlib.Path(cache).resolve() / ("apt-" + release_of(container))
    for folder in ("etc/trusted.gpg.d", "etc/preferences.d", "lists/partial", "archives/partial"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    for source, target in (("/etc/apt/sources.list", "etc/sources.list"), ("/var/lib/dpkg/status", "status")):
        (root / target).write_text(on_host(container, "cat %s" % source)[1])
    run("docker", "cp", container + ":/etc/apt/trusted.gpg.d/.", str(root / "etc/trusted.gpg.d"))
    apt = ["apt-get", "-q", "-o", "Dir::Etc=%s/etc" % root, "-o", "Dir::Etc::SourceParts=-",
           "-o", "Dir::State=%s" % root, "-o", "Dir::State::Lists=%s/lists" % root,
           "-o", "Dir::State::status=%s/status" % root, "-o", "Dir::Cache::archives=%s/archives" % root,
           "-o", "Dir::Cache::pkgcache=", "-o", "Dir::Cache::srcpkgcache=", "-o", "Debug::NoLocking=1",
           "-o", "APT::Sandbox::User=root", "-o", "APT::Architecture=" + on_host(container, "dpkg --print-architecture")[1].strip(),
           # the mirror may serve a release's lists past their Valid-Until date (tools/build-image.sh)
           "-o", "Acquire::Check-Valid-Until=false"]
    run(*apt, "update")
    run(*apt, "-y", "--no-install-recommends", "--download-only", "install", *packages)
    # The packages apt would install, by name and version; the archive may hold older ones too.
    simulated = run(*apt, "-s", "--no-install-recommends", "install", *packages).stdout
    wanted = [line.split()[1:3] for line in simulated.splitlines() if line.startswith("Inst ")]
    files = []
    for name, version in wanted:
        version = version.strip("(").replace(":", "%3a")
        found = sorted((root / "archives").glob("%s_%s_*.deb" % (name, version)))
        assert len(found) == 1, "no single download of %s %s in %s" % (name, version, root / "archives")
        files += found
    return files


def wheels(pins, python, cache):
    """Download the pinned wheels for that Python on x86_64 Linux (glibc 2.31,
    Debian 11's); returns the folder."""
    folder = pathlib.Path(cache) / ("wheels-" + python)
    platforms = [option for tag in ("manylinux_2_31", "manylinux_2_28", "manylinux_2_17", "manylinux2014")
                 for option in ("--platform", tag + "_x86_64")]
    run(sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
        "--only-binary=:all:", "--python-version", python, "--implementation", "cp", *platforms,
        "--dest", str(folder), "-r", str(pins))
    return folder


def prepare(container, tarball, cache):
    """Install git, ansible-core and the collection's tarball on the host;
    returns the folder of ansible-pull there."""
    release = RELEASES[release_of(container)]
    debs = debian_packages(container, release["packages"], cache)
    copy_in(container, debs, INBOX + "/debs")
    on_host(container, "DEBIAN_FRONTEND=noninteractive apt-get install -qq -y --no-install-recommends %s/debs/*.deb"
            % INBOX)
    if "wheels" in release:
        found = wheels(release["wheels"], release["python"], cache)
        copy_in(container, [release["wheels"], *sorted(found.glob("*.whl"))], INBOX + "/wheels")
        venv = os.path.dirname(release["bin"])
        on_host(container, "python3 -m venv %s && %s/pip install --quiet --no-index --no-deps --no-compile "
                "--find-links %s/wheels -r %s/wheels/%s" % (venv, release["bin"], INBOX, INBOX, release["wheels"].name))
    copy_in(container, [tarball], INBOX)
    on_host(container, "%s/ansible-galaxy collection install --force -p %s %s/%s"
            % (release["bin"], COLLECTIONS, INBOX, pathlib.Path(tarball).name))
    return release["bin"]


def publish(container, work_tree, bare="/srv/consumers.git"):
    """Make bare on the host a bare clone of the git work tree of this machine
    (replacing the last one): the repository the host pulls from."""
    with tempfile.TemporaryDirectory() as folder:
        clone = pathlib.Path(folder) / pathlib.Path(bare).name
        run("git", "clone", "--quiet", "--bare", str(work_tree), str(clone))
        on_host(container, "rm -rf %s" % bare)
        copy_in(container, [clone], os.path.dirname(bare))
    return bare


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: pull_host.py CONTAINER TARBALL CACHE_DIR")
    print(prepare(*sys.argv[1:]))
