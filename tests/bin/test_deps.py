"""bin/deps: which Debian packages are missing (dpkg's own records), and how they are installed.

dpkg-query is the real one. apt-get and sudo are stand-ins on PATH that write down how they
were called: a test must not install packages on the machine that runs it.
"""

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.serving import ROOT

DEPS = ROOT / "bin" / "deps"
INSTALLED = ["dpkg", "bash"]  # Essential: on every Debian system
MISSING = "no-such-package-limiter-tests"
# What bin/deps runs, besides apt-get and sudo.
TOOLS = ("bash", "env", "dpkg-query", "awk", "id")

pytestmark = pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="not a Debian system")


class Machine:
    """A PATH holding only bin/deps's tools, and stand-ins for apt-get (exit status
    `apt_status`) and, if `sudo`, for sudo; each stand-in appends its arguments to calls.log."""

    def __init__(self, directory: Path, sudo: bool = False, apt_status: int = 0) -> None:
        self.directory = directory
        self.bin = directory / "bin"
        self.bin.mkdir()
        for tool in TOOLS:
            (self.bin / tool).symlink_to(shutil.which(tool))
        # A copy: `nobody` may not reach the checkout (CI's may sit in root's home).
        self.deps = directory / "deps"
        shutil.copy(DEPS, self.deps)
        self.log = directory / "calls.log"
        self.log.touch()
        self.log.chmod(0o666)  # the stand-ins may run as `nobody`
        self._stand_in("apt-get", f"exit {apt_status}")
        if sudo:
            self._stand_in("sudo", 'exec "$@"')

    def _stand_in(self, name: str, then: str) -> None:
        script = self.bin / name
        script.write_text(f'#!/bin/sh\necho "{name} $*" >> "{self.log}"\n{then}\n')
        script.chmod(0o755)

    def run(self, *packages: str, as_user: str | None = None) -> subprocess.CompletedProcess:
        command = [str(self.deps), *packages]
        if as_user is not None:
            account = pwd.getpwnam(as_user)
            setpriv = shutil.which("setpriv") or "setpriv"
            command = [setpriv, f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--clear-groups", *command]
        env = {"PATH": str(self.bin), "LC_ALL": "C"}
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines()


def not_root() -> str | None:
    """Run as an unprivileged account: `nobody` when the tests run as root, else as we are."""
    return "nobody" if os.geteuid() == 0 else None


@pytest.fixture
def directory():
    """A directory that `nobody` can reach too (pytest's tmp_path is root's alone)."""
    with tempfile.TemporaryDirectory(prefix="limiter-deps-") as name:
        os.chmod(name, 0o755)
        yield Path(name)


@pytest.fixture
def machine(directory):
    return Machine(directory)


def test_it_installs_nothing_and_says_nothing_when_every_package_is_there(machine):
    done = machine.run(*INSTALLED)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert machine.calls() == []


def test_with_no_packages_named_it_does_nothing(machine):
    done = machine.run()
    assert (done.returncode, done.stderr) == (0, "")
    assert machine.calls() == []


@pytest.mark.skipif(os.geteuid() != 0, reason="installs as root only when run as root")
def test_as_root_it_updates_the_lists_then_installs_only_the_missing_packages(machine):
    done = machine.run(INSTALLED[0], MISSING, INSTALLED[1])
    assert done.returncode == 0, done.stderr
    assert machine.calls() == [
        "apt-get -o DPkg::Lock::Timeout=300 update -qq",
        f"apt-get -o DPkg::Lock::Timeout=300 install -y -qq {MISSING}",
    ]
    assert done.stderr == f"bin/deps: installing {MISSING}\n"


def test_anyone_else_installs_through_sudo(directory):
    machine = Machine(directory, sudo=True)
    done = machine.run(MISSING, *INSTALLED, as_user=not_root())
    assert done.returncode == 0, done.stderr
    assert machine.calls() == [
        "sudo env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 update -qq",
        "apt-get -o DPkg::Lock::Timeout=300 update -qq",
        f"sudo env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq {MISSING}",
        f"apt-get -o DPkg::Lock::Timeout=300 install -y -qq {MISSING}",
    ]


def test_without_root_or_sudo_it_stops_with_one_line_naming_the_packages_and_the_command(machine):
    done = machine.run(MISSING, "bash", "another-missing-package", as_user=not_root())
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"bin/deps: missing Debian packages: {MISSING} another-missing-package; install them with: "
        f"sudo apt-get update && sudo apt-get install -y {MISSING} another-missing-package"
    ]
    assert machine.calls() == []


def test_when_apt_get_fails_it_ends_with_the_same_line_and_a_failure(directory):
    machine = Machine(directory, sudo=True, apt_status=100)
    done = machine.run(MISSING, as_user=not_root())
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        f"bin/deps: missing Debian packages: {MISSING}; install them with: "
        f"sudo apt-get update && sudo apt-get install -y {MISSING}"
    )
    assert len(machine.calls()) == 2  # sudo, then apt-get update, which failed: no install tried
