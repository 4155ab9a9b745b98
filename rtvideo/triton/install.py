"""Finding a runnable ``tritonserver`` and what it needs around it.

Where the binary comes from (:func:`find_tritonserver`), first match wins:

1. ``$TRITONSERVER``: path of a ``tritonserver`` binary;
2. ``tritonserver`` on ``PATH`` (the NGC container: backends live in
   ``/opt/tritonserver/backends``, nothing to prepare);
3. the ``nvidia-pytriton`` wheel (``pip install rtvideo[server]``), whose
   Python backend needs the stub that matches the running interpreter. The wheel
   is never modified: a backend directory is assembled in a cache directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import sys
import sysconfig
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["TritonInstall", "find_tritonserver"]

_STUB_NAME = "triton_python_backend_stub"


@dataclass
class TritonInstall:
    """A runnable ``tritonserver`` and what it needs around it."""

    binary: Path
    kind: str  # "env" ($TRITONSERVER), "path" (on PATH) or "wheel" (nvidia-pytriton)
    backend_directory: Path | None = None  # None: the binary's default (/opt/tritonserver/backends)
    cache_directory: Path | None = None
    library_dirs: list[Path] = field(default_factory=list)  # prepended to LD_LIBRARY_PATH

    def environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for the server and the Python-backend stubs it spawns."""
        env = dict(os.environ if base is None else base)
        lib_dirs = [str(d) for d in _interpreter_library_dirs() + list(self.library_dirs)]
        if env.get("LD_LIBRARY_PATH"):
            lib_dirs.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(_dedupe(lib_dirs))
        # The stub's embedded Python finds its prefix through PATH: venv bin first
        # makes it import the venv's packages (numpy, torch, rtvideo, ...).
        # sys.executable is deliberately not resolved: the venv's bin is the point.
        path = [os.path.dirname(sys.executable)]
        if env.get("PATH"):
            path.append(env["PATH"])
        env["PATH"] = os.pathsep.join(_dedupe(path))
        return env


def find_tritonserver() -> TritonInstall:
    """Locate ``tritonserver``: ``$TRITONSERVER``, else ``PATH``, else the nvidia-pytriton wheel."""
    env_value = os.environ.get("TRITONSERVER")
    if env_value:
        binary = Path(env_value).expanduser()
        if not binary.is_file() or not os.access(binary, os.X_OK):
            raise FileNotFoundError(
                f"TRITONSERVER={env_value!r} does not name an executable tritonserver binary; "
                "fix or unset $TRITONSERVER to use tritonserver on PATH or the nvidia-pytriton wheel"
            )
        binary = binary.resolve()
        wheel_root = binary.parent.parent
        if (wheel_root / "python_backend_stubs").is_dir():
            return _wheel_install(wheel_root, binary=binary, kind="env")
        backends = wheel_root / "backends"
        return TritonInstall(binary=binary, kind="env", backend_directory=backends if backends.is_dir() else None)

    on_path = shutil.which("tritonserver")
    if on_path:
        return TritonInstall(binary=Path(on_path), kind="path")

    pytriton_root = _pytriton_server_dir()
    if pytriton_root is None:
        raise FileNotFoundError(
            "no tritonserver found: set $TRITONSERVER, put tritonserver on PATH (NGC container), "
            "or install the wheel with `pip install 'rtvideo[server]'` (nvidia-pytriton)"
        )
    return _wheel_install(pytriton_root, binary=pytriton_root / "bin" / "tritonserver", kind="wheel")


def _dedupe(items: list[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for item in items:
        if item and item not in seen:
            seen.add(item)
            out.append(item)
    return out


def _interpreter_library_dirs() -> list[Path]:
    # The stub links libpython3.X.so; take the running interpreter's before any system copy.
    libdir = sysconfig.get_config_var("LIBDIR")
    return [Path(libdir)] if libdir else []


def _pytriton_server_dir() -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "tritonserver"
        if (candidate / "bin" / "tritonserver").is_file():
            return candidate
    return None


def _wheel_install(wheel_root: Path, *, binary: Path, kind: str) -> TritonInstall:
    """Wheel layout: ``<root>/{bin,backends,caches,python_backend_stubs/3.X}``, libs in
    ``<site-packages>/nvidia_pytriton.libs`` (reached by relative RPATHs only)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = wheel_root / "python_backend_stubs" / version / _STUB_NAME
    if not stub.is_file():
        available = sorted(p.name for p in (wheel_root / "python_backend_stubs").iterdir())
        raise FileNotFoundError(
            f"the nvidia-pytriton wheel at {wheel_root} has no Python-backend stub for Python "
            f"{version} (it has: {', '.join(available)})"
        )
    _warn_if_numpy2()
    library_dirs = [
        d for d in (wheel_root.parent.parent / "nvidia_pytriton.libs", wheel_root / "external_libs") if d.is_dir()
    ]
    caches = wheel_root / "caches"
    return TritonInstall(
        binary=binary,
        kind=kind,
        backend_directory=_prepare_backend_directory(wheel_root, stub, version),
        cache_directory=caches if caches.is_dir() else None,
        library_dirs=library_dirs,
    )


def _warn_if_numpy2() -> None:
    from importlib import metadata

    try:
        major = int(metadata.version("numpy").split(".")[0])
    except (metadata.PackageNotFoundError, ValueError):
        return
    if major >= 2:
        warnings.warn(
            "numpy>=2 with the nvidia-pytriton stub: BYTES tensors decode as garbage; install numpy<2",
            RuntimeWarning,
            stacklevel=3,  # find_tritonserver's caller
        )


def cache_root() -> Path:
    """`$XDG_CACHE_HOME/rtvideo` (`~/.cache/rtvideo`), else `<tmp>/rtvideo-<uid>`. tritonserver
    loads backends from there, so a directory in the shared temp dir that another user made
    (or can write to, or a link) is refused: it would run their code as this user."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    root = Path(base) / "rtvideo"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if os.access(root, os.W_OK):
            return root
    except OSError:
        pass
    root = Path(tempfile.gettempdir()) / f"rtvideo-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        root.mkdir(mode=0o700)
    st = root.lstat()
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise RuntimeError(
            f"{root} is not a directory of this user's own that only it may write to (owner uid {st.st_uid}, "
            f"mode {stat.filemode(st.st_mode)}); remove it, or make {Path(base) / 'rtvideo'} writable "
            "(or set XDG_CACHE_HOME)"
        )
    return root


def _prepare_backend_directory(wheel_root: Path, stub: Path, version: str) -> Path:
    """``<cache>/triton-backends-<hash>/``: the wheel's backends as symlinks, with the stub
    for this interpreter in ``python/``. Built in a temp dir and renamed into place, so
    concurrent launches never see a half-built directory."""
    st = stub.stat()
    key = f"{wheel_root.resolve()}|{version}|{st.st_size}|{st.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    root = cache_root()
    target = root / f"triton-backends-{digest}"
    if _backend_directory_ok(target):
        return target
    if target.exists() or target.is_symlink():
        shutil.rmtree(target, ignore_errors=True)  # stale (the wheel moved or was reinstalled)

    staging = Path(tempfile.mkdtemp(prefix=".triton-backends-", dir=root))
    os.chmod(staging, 0o755)  # mkdtemp makes it 0700
    try:
        for backend in sorted((wheel_root / "backends").iterdir()):
            if backend.name == "python":
                continue
            os.symlink(backend.resolve(), staging / backend.name)
        python_dir = staging / "python"
        python_dir.mkdir()
        for item in sorted((wheel_root / "backends" / "python").iterdir()):
            if item.name in ("__pycache__", _STUB_NAME):
                continue
            os.symlink(item.resolve(), python_dir / item.name)
        # A symlink keeps the stub's $ORIGIN-relative RPATH valid (the kernel resolves it).
        os.symlink(stub.resolve(), python_dir / _STUB_NAME)
        try:
            os.rename(staging, target)
        except OSError:
            if not _backend_directory_ok(target):  # lost a race to a broken copy: surface it
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _backend_directory_ok(target: Path) -> bool:
    python_dir = target / "python"
    return (python_dir / _STUB_NAME).is_file() and (python_dir / "libtriton_python.so").is_file()
