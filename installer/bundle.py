"""Build the offline bundle: one tar with a wheelhouse, its lock, the packaging files and install.sh.

    installer/build-bundle --variant cpu|cuda --out DIR [--sign-key KEY] [--torch-index URL] [--dry-run]
    installer/build-bundle --make-key NAME        writes NAME.key (private, 0600) and NAME.pub

The wheelhouse holds the project's wheel and every runtime dependency as wheels for the
platform this runs on (Linux x86_64, CPython 3.11, like the servers it installs on). The
versions are the known-good set: those of the environment running this script, which
installer/venv.sh made and the tests ran in. pip resolves the runtime dependencies (no dev
extras) under those versions as constraints, so the lock holds exactly what was tested.

torch is the variant's build. cpu: the very CPU build installed here (torch==X+cpu), from
wherever pip's configuration finds it (this machine: find-links /opt/wheels; elsewhere
--torch-index https://download.pytorch.org/whl/cpu). cuda: PyPI's build with its nvidia-*
wheels (several GB), pip's local configuration ignored so that no CPU wheel is picked up.

torchvision is left out: optimum-intel requires it, but it does not import beside the CPU
torch and the appliance never touches the parts of optimum-intel that use it. install.sh
installs the lock with --no-deps, so nothing asks for it.

The bundle's SHA256SUMS lists every other file in it, and SHA256SUMS.sig, when a key is
given, is an Ed25519 signature of SHA256SUMS that install.sh checks with openssl.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

REPOSITORY = Path(__file__).resolve().parent.parent
PROJECT = "appliance"
LEFT_OUT = ("torchvision",)
VARIANTS = ("cpu", "cuda")
# Left out of the copy the project's wheel is built from: not part of it, or large.
TORCH_HINT = ("if pip found no torch wheel: the cpu variant needs torch's CPU build, from --torch-index"
              " https://download.pytorch.org/whl/cpu or a find-links directory in pip's configuration")
NOT_SOURCE = (".git", ".venv", "var", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", "tests", "bench")


class BundleError(Exception):
    """The bundle cannot be built as asked; the message says why, the hint what to do."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message, self.hint = message, hint


@dataclass(frozen=True)
class Target:
    """What to build: which torch, and how pip is to find packages."""

    variant: str
    torch: str  # the requirement, e.g. torch==2.13.0+cpu
    pip_env: dict[str, str]
    pip_options: tuple[str, ...]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="installer/build-bundle", description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", choices=VARIANTS, help="cpu: torch's CPU build; cuda: PyPI's CUDA build")
    parser.add_argument("--out", type=Path, help="directory for the bundle")
    parser.add_argument("--sign-key", type=Path, help="Ed25519 private key (PEM) to sign SHA256SUMS with")
    parser.add_argument("--torch-index", help="an extra package index for torch, e.g. https://download.pytorch.org/whl/cpu")
    parser.add_argument("--source", type=Path, default=REPOSITORY, help="project to bundle (default: this checkout)")
    parser.add_argument("--dry-run", action="store_true", help="resolve and list the wheels; download nothing")
    parser.add_argument("--make-key", type=Path, metavar="NAME", help="write a key pair NAME.key and NAME.pub")
    args = parser.parse_args(argv)
    try:
        if args.make_key:
            private, public = make_key(args.make_key)
            print(f"wrote {private} (keep it private) and {public} (give it to the sites that install)")
            return 0
        if not args.variant or (not args.out and not args.dry_run):
            parser.error("--variant and --out are needed (or --make-key)")
        target = _target(args.variant, args.torch_index)
        if args.dry_run:
            for name, version in dry_run(args.source, target):
                print(f"{name}=={version}")
            return 0
        bundle = build(args.source, target, args.out, args.sign_key)
    except BundleError as exc:
        print(f"build-bundle: error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"  hint: {exc.hint}", file=sys.stderr)
        return 1
    top = bundle.name.removesuffix(".tar")
    print(f"\n{bundle} ({bundle.stat().st_size / 2**20:.0f} MiB){', signed' if args.sign_key else ''}")
    print("on the server, as root:")
    print(f"  tar -xf {bundle.name} && ./{top}/install.sh" + (" --pubkey KEY.pub" if args.sign_key else ""))
    return 0


# -- keys ---------------------------------------------------------------------------------


def make_key(name: Path) -> tuple[Path, Path]:
    """A new Ed25519 key pair: NAME.key (PKCS#8 PEM, mode 0600) and NAME.pub (SubjectPublicKeyInfo PEM)."""
    private, public = name.with_name(name.name + ".key"), name.with_name(name.name + ".pub")
    key = Ed25519PrivateKey.generate()
    try:
        descriptor = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError as exc:
        raise BundleError(f"{private} already exists", "it is kept; choose another name") from exc
    with os.fdopen(descriptor, "wb") as file:
        file.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def _signing_key(path: Path) -> Ed25519PrivateKey:
    try:
        if stat.S_IMODE(path.stat().st_mode) & 0o077:
            raise BundleError(f"the signing key {path} is readable by group or others", f"run 'chmod 600 {path}'")
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise BundleError(f"cannot read the signing key {path}: {exc}",
                          "give an unencrypted Ed25519 key in PEM, as --make-key writes") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise BundleError(f"{path} is not an Ed25519 key", "make one with --make-key")
    return key


# -- what goes in -------------------------------------------------------------------------


def _target(variant: str, torch_index: str | None) -> Target:
    """The torch requirement and pip's environment for a variant, from the torch installed here."""
    try:
        installed = Version(metadata.version("torch"))
    except metadata.PackageNotFoundError as exc:
        raise BundleError("torch is not installed in this environment", "run installer/venv.sh first") from exc
    options = ("--extra-index-url", torch_index) if torch_index else ()
    if variant == "cpu":
        if installed.local != "cpu":
            raise BundleError(f"this environment has torch {installed}, not a CPU build",
                              "build the cpu bundle from the environment installer/venv.sh makes")
        return Target(variant, f"torch=={installed}", dict(os.environ), options)
    # pip's configuration here finds the CPU wheel first (find-links); for CUDA, plain PyPI.
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("PIP_") or name in ("PIP_CERT", "PIP_DEFAULT_TIMEOUT", "PIP_CACHE_DIR")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return Target(variant, f"torch=={installed.public}", env, options)


def _constraints(path: Path) -> Path:
    """The known-good versions: every distribution of this environment but the project and torch."""
    pins = sorted(f"{canonicalize_name(dist.metadata['Name'])}=={dist.version}" for dist in metadata.distributions()
                  if canonicalize_name(dist.metadata["Name"]) not in (PROJECT, "torch"))
    path.write_text("\n".join(pins) + "\n")
    return path


def _project_wheel(source: Path, work: Path) -> Path:
    """The project's wheel, built from a clean copy so that no stale build/ output slips in."""
    if not (source / "pyproject.toml").is_file():
        raise BundleError(f"{source} has no pyproject.toml", "give the project's checkout with --source")
    copy = work / "source"
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    _pip(["wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir", str(work / "wheel"), str(copy)],
         dict(os.environ), "building the project's wheel failed", "run installer/venv.sh, then try again")
    (wheel,) = (work / "wheel").glob("*.whl")
    return wheel


def dry_run(source: Path, target: Target) -> list[tuple[str, str]]:
    """(name, version) of every wheel the bundle would hold, resolved without downloading them."""
    with tempfile.TemporaryDirectory() as work:
        project = _project_wheel(source, Path(work))
        report = Path(work) / "report.json"
        _pip(["install", "--quiet", "--dry-run", "--ignore-installed", "--only-binary=:all:", "--report", str(report),
              "--constraint", str(_constraints(Path(work) / "constraints.txt")), *target.pip_options,
              str(project), target.torch, "pip"], target.pip_env, "resolving the wheelhouse failed", TORCH_HINT)
        found = [(item["metadata"]["name"], item["metadata"]["version"]) for item in json.loads(report.read_text())["install"]]
    return sorted((name, version) for name, version in found if canonicalize_name(name) not in LEFT_OUT)


def _wheelhouse(source: Path, target: Target, work: Path, wheelhouse: Path) -> None:
    project = _project_wheel(source, work)
    print(f"build-bundle: downloading the wheelhouse ({target.variant}, {target.torch})", file=sys.stderr)
    _pip(["download", "--only-binary=:all:", "--dest", str(wheelhouse), "--progress-bar", "off",
          "--constraint", str(_constraints(work / "constraints.txt")), *target.pip_options,
          str(project), target.torch, "pip"], target.pip_env, "downloading the wheelhouse failed", TORCH_HINT)
    for wheel in wheelhouse.glob("*.whl"):
        if canonicalize_name(parse_wheel_filename(wheel.name)[0]) in LEFT_OUT:
            wheel.unlink()
    torch = [str(parse_wheel_filename(w.name)[1]) for w in wheelhouse.glob("torch-*.whl")]
    if target.variant == "cuda" and any(Version(version).local for version in torch):
        raise BundleError(f"the cuda bundle got torch {torch[0]}, a build for one platform only",
                          "leave --torch-index out, or give an index of CUDA builds")


def _pip(args: list[str], env: dict[str, str], failure: str, hint: str) -> None:
    result = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], env=env,
                            stdout=sys.stderr, stderr=subprocess.PIPE, text=True, check=False)
    noise = "is ignored: it is neither a file nor a directory"  # this machine's pip.conf names absent indexes
    errors = "\n".join(line for line in result.stderr.splitlines() if noise not in line)
    if result.returncode != 0:
        raise BundleError(f"{failure}:\n{errors.strip()}", hint)
    if errors.strip():
        print(errors, file=sys.stderr)


def _lock(wheelhouse: Path) -> str:
    """requirements.lock: every wheel pinned by version and hash, for pip --require-hashes --no-deps."""
    lines = []
    for wheel in sorted(wheelhouse.glob("*.whl")):
        name, version, *_ = parse_wheel_filename(wheel.name)
        lines.append(f"{name}=={version} --hash=sha256:{_sha256(wheel)}")
    return "\n".join(lines) + "\n"


# -- the bundle ---------------------------------------------------------------------------


def build(source: Path, target: Target, out: Path, sign_key: Path | None = None) -> Path:
    """Build the bundle in out and return the tar's path."""
    signer = _signing_key(sign_key) if sign_key else None  # refuse a bad key before a long download
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=".build-") as work:
        stage = Path(work) / "bundle"
        (stage / "wheelhouse").mkdir(parents=True)
        _wheelhouse(source, target, Path(work), stage / "wheelhouse")
        lock = _lock(stage / "wheelhouse")
        (stage / "requirements.lock").write_text(lock)
        version = next(str(parse_wheel_filename(w.name)[1]) for w in (stage / "wheelhouse").glob(f"{PROJECT}-*.whl"))
        release = f"{version}-{hashlib.sha256(lock.encode()).hexdigest()[:8]}"
        shutil.copy2(source / "installer" / "install.sh", stage / "install.sh")
        shutil.copytree(source / "packaging", stage / "packaging")
        torch = next(line.split()[0].split("==")[1] for line in lock.splitlines() if line.startswith("torch=="))
        (stage / "RELEASE").write_text(
            f"release={release}\nversion={version}\nvariant={target.variant}\npython=3.11\ntorch={torch}\n"
            f"built={datetime.now(UTC).isoformat(timespec='seconds')}\n")
        sums = "".join(f"{_sha256(path)}  {path.relative_to(stage)}\n"
                       for path in sorted(stage.rglob("*")) if path.is_file())
        (stage / "SHA256SUMS").write_text(sums)
        if signer is not None:
            (stage / "SHA256SUMS.sig").write_bytes(signer.sign(sums.encode()))
        return _tar(stage, out / f"{PROJECT}-{release}-{target.variant}.tar")


def _tar(stage: Path, path: Path) -> Path:
    """An uncompressed tar (wheels are compressed already) under one top directory, written then renamed."""
    top = path.name.removesuffix(".tar")

    def normalised(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        info.mode = 0o755 if info.isdir() or info.name.endswith("install.sh") else 0o644
        return info

    partial = path.with_name(path.name + ".partial")
    try:
        with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as archive:
            archive.add(stage, arcname=top, filter=normalised)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


if __name__ == "__main__":
    sys.exit(main())
