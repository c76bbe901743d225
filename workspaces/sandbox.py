"""The bubblewrap sandbox a command runs in (contract §4.4): one call becomes one bwrap argv.

Inside, the command has its own user, mount, PID, IPC and UTS namespaces (and its own empty
network namespace when its workspace is registered without network). The filesystem is the
host's, read-only, with the worker's own files (its code base and ``var/``, its home, its
credentials, the other workspaces) over-mounted by empty tmpfs, and only the call's own tree
bound writable, less what git on the host would run or take its configuration from (hooks,
git config, the files that point git at another git directory), which stays read-only. ``/proc`` is mounted inside the new PID namespace, so the worker's processes
and their environments do not exist there. bwrap's PID 1 exits when the command does, and the
kernel then kills everything left in the namespace: ``setsid -f`` and double forks included.

What bwrap cannot report: a command killed by a signal comes back as exit status 128+n, as a
shell would show it, because bwrap turns the signal into that number itself.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

NAMESPACES = ("--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts")
# In bwrap's own environment only (bwrap unsets it for what it starts): it names the worker
# process that started the sandbox, for that process's undertaker (operations/undertaker.py).
MARK_ENV = "SLUICE_SANDBOX_OF"


@dataclass(frozen=True)
class Limits:
    """Per-call rlimits, applied by prlimit(1) inside the sandbox; 0 means none.

    RLIMIT_NPROC counts the processes of the sandbox's own user namespace (Linux 5.14+), so it
    bounds one call's fork bomb; the kernel does not apply it to a worker running as root.
    """

    max_processes: int = 1024
    max_file_bytes: int = 4 << 30
    max_address_space_bytes: int = 16 << 30

    def prlimit_args(self) -> list[str]:
        pairs = (
            ("--nproc", self.max_processes),
            ("--fsize", self.max_file_bytes),
            ("--as", self.max_address_space_bytes),
        )
        return [f"{flag}={value}" for flag, value in pairs if value > 0]


@dataclass(frozen=True)
class Sandbox:
    """How one worker confines its commands; the per-call part is given to ``argv``."""

    bwrap: str
    prlimit: str | None
    # Directories over-mounted with an empty read-only tmpfs.
    hidden: tuple[str, ...] = ()
    # The worker's $HOME: a private, writable, empty tmpfs for each call.
    home: str | None = None
    # Shown again read-only inside a hidden directory: the toolchains on PATH under $HOME.
    shown: tuple[str, ...] = ()
    # Directories every call may write besides its own tree (runworker --command-shared-dir):
    # a build cache, say. What one call leaves there the next one sees.
    shared: tuple[str, ...] = ()
    limits: Limits = field(default_factory=Limits)

    def argv(
        self,
        command: str,
        *,
        workspace_root: str,
        worktree: str | None,
        cwd: str,
        network: bool,
    ) -> list[str]:
        writable = call_tree(workspace_root, worktree)
        others = [p for p in self.hidden if p != workspace_root]
        # A hidden path inside another one is already gone (the outer tmpfs is empty); one
        # inside the workspace (a code base registered as one) is hidden last, over the
        # workspace's own bind.
        inside = [p for p in others if _within(p, workspace_root)]
        # $HOME gets a private tmpfs of its own below: what is hidden inside it is gone too.
        home = self.home if self.home and not _within(self.home, workspace_root) else None
        outer = [
            p
            for p in others
            if p not in inside
            and not any(q != p and _within(p, q) for q in others)
            and not (home and _within(p, home))
        ]
        # --cap-drop ALL: run by root (a container), bwrap would keep every capability, and
        # with CAP_SYS_ADMIN a command unmounts whatever hides a secret or remounts /
        # read-write. Unprivileged bwrap drops them anyway; this makes root the same.
        args = [self.bwrap, *NAMESPACES, "--cap-drop", "ALL", "--die-with-parent", "--new-session"]
        args += ["--unsetenv", MARK_ENV]
        if not network:
            args.append("--unshare-net")
        args += ["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        # Hiding tmpfs stay writable until every mount inside them is made (the workspace
        # itself may live inside a hidden directory, as make run's demo does under var/), and
        # are made read-only last: a remount does not reach the binds below it.
        hiding = [p for p in (*outer, *inside) if os.path.isdir(p)]
        # A shared directory is bound over what hid it; what must stay hidden inside a shared
        # directory (another workspace kept there) is hidden again over the shared bind.
        in_shared = [p for p in outer if any(_within(p, d) for d in self.shared)]
        for path in outer:
            if path not in in_shared:
                args += _hide(path)
        if home:
            args += ["--tmpfs", home]
        for path in self.shown:
            if os.path.exists(path):
                args += ["--ro-bind", path, path]
        for path in self.shared:
            args += ["--bind", path, path]
        for path in in_shared:
            args += _hide(path)
        # The workspace again, read-only, above whatever hid it (a home, the private /tmp).
        args += ["--ro-bind", workspace_root, workspace_root]
        for path in writable:
            args += ["--bind", path, path]
        args += git_guard_args(writable, workspace_root, worktree)
        for path in inside:
            args += _hide(path)
        for path in hiding:
            args += ["--remount-ro", path]
        args += ["--setenv", "TMPDIR", "/tmp", "--chdir", cwd, "--"]
        if self.prlimit and self.limits.prlimit_args():
            args += [self.prlimit, *self.limits.prlimit_args(), "--"]
        return [*args, "/bin/sh", "-c", command]


def call_tree(workspace_root: str, worktree: str | None) -> list[str]:
    """The paths a call may write: the checkout, or a lane and the git metadata its commits
    write. A lane's ``.git/worktrees/<name>`` holds its HEAD, index and their locks; commits
    also write the shared objects, branch refs and reflogs. packed-refs and ``.git/config``
    stay read-only: git rewrites them only to delete a ref or change configuration."""
    if not worktree:
        return [workspace_root]
    git_dir = os.path.realpath(os.path.join(workspace_root, ".git"))
    lane = os.path.realpath(os.path.join(workspace_root, ".worktrees", worktree))
    admin = os.path.realpath(os.path.join(git_dir, "worktrees", worktree))
    shared = [os.path.join(git_dir, name) for name in ("objects", "refs", "logs")]
    return [lane, admin, *(p for p in shared if os.path.isdir(p))]


# In a repository's own git directory (the checkout's ``.git``, a submodule's under
# ``modules/``): what git executes (hooks) or takes its configuration from, including
# ``commondir``, which would point git at a configuration somewhere else.
_GITDIR_GUARDED = ("config", "config.worktree", "hooks", "info", "commondir")
# In a linked worktree's admin directory: its own configuration and its two pointers.
_ADMIN_GUARDED = ("config.worktree", "commondir", "gitdir")
# Created empty on the host when missing, so that they can be bound read-only: empty, they
# change nothing git does.
_CREATED_DIRS = frozenset({"hooks", "info"})
_CREATED_FILES = frozenset({"config.worktree"})
# A repository's own git directory has no commondir, and an empty one breaks git, so while
# calls run one pointing at the directory itself covers the name: git reads it as "the common
# directory is this one", which is what having none means.
_PLACEHOLDER = b".\n"
_placeholders: dict[str, int] = {}
_placeholders_lock = threading.Lock()


@dataclass(frozen=True)
class _GitLayout:
    """The git metadata inside the trees one call may write."""

    repository_dirs: tuple[str, ...]  # a repository's own git directories (checkout, submodules)
    admin_dirs: tuple[str, ...]  # linked worktrees' admin directories
    pointer_files: tuple[str, ...]  # a lane's ``.git`` file, or the checkout's


def _git_layout(workspace_root: str, worktree: str | None) -> _GitLayout:
    root = os.path.realpath(workspace_root)
    repository: list[str] = []
    admins: list[str] = []
    pointers: list[str] = []
    if worktree:
        # The checkout's own .git is read-only to a lane call; only its admin directory and
        # its lane are not.
        lane = os.path.realpath(os.path.join(root, ".worktrees", worktree))
        admins.append(os.path.realpath(os.path.join(root, ".git", "worktrees", worktree)))
        pointers.append(os.path.join(lane, ".git"))
    else:
        dot_git = os.path.join(root, ".git")
        if os.path.islink(dot_git):
            pass
        elif os.path.isfile(dot_git):
            pointers.append(dot_git)
        elif os.path.isdir(dot_git):
            repository.append(dot_git)
            for name in _subdirs(os.path.join(dot_git, "worktrees")):
                admin = os.path.join(dot_git, "worktrees", name)
                admins.append(admin)
                lane = _pointer(os.path.join(admin, "gitdir"))
                if lane:
                    pointers.append(os.path.normpath(os.path.join(admin, lane)))
    admins = [a for a in admins if os.path.isdir(a) and not os.path.islink(a)]
    for git_dir in (*repository, *admins):
        for module in _submodule_dirs(git_dir):
            repository.append(module)
            # A submodule's working tree names its git directory with a .git file, as a lane does.
            tree = _core_worktree(os.path.join(module, "config"))
            if tree:
                pointers.append(os.path.normpath(os.path.join(module, tree, ".git")))
    return _GitLayout(tuple(repository), tuple(admins), tuple(pointers))


def _core_worktree(config: str) -> str:
    """``core.worktree`` as git writes it into a submodule's config, or ""."""
    section = ""
    for raw in _read_small(config, 65536).decode("utf-8", errors="replace").splitlines():
        line = raw.strip()
        if line.startswith("["):
            section = line.strip("[]").strip().lower()
            continue
        key, _, value = line.partition("=")
        if section == "core" and key.strip().lower() == "worktree":
            return value.strip().strip('"')
    return ""


def _submodule_dirs(git_dir: str) -> list[str]:
    modules = os.path.join(git_dir, "modules")
    found: list[str] = []
    # A submodule's name may hold slashes: its git directory is wherever a HEAD is found,
    # and only its own modules/ can hold more of them.
    for current, dirs, files in os.walk(modules):
        if current != modules and "HEAD" in files:
            found.append(current)
            dirs[:] = [d for d in dirs if d == "modules"]
    return found


def git_guard_args(writable: list[str], workspace_root: str, worktree: str | None) -> list[str]:
    """bwrap arguments that keep a call from changing what the host's git runs (issue 34).

    Everything git executes or reads its configuration from, inside the trees a call may
    write, is bound read-only over itself: hooks, config, config.worktree, info, and the
    pointer files (commondir, gitdir, a lane's ``.git`` file) that would send git to a
    configuration elsewhere. A missing hooks or info directory or config.worktree is created
    empty first (a mount needs something to cover); a missing commondir is covered by
    ``hold_git_placeholders``. Every directory between a writable bind and a guarded path is
    bound over itself too: a mount point cannot be renamed or removed, so a command cannot
    move ``.git`` (or a lane) aside and put a planted one in its place."""
    layout = _git_layout(workspace_root, worktree)
    # A pointer file's path comes from what git wrote, and may pass through a symlink.
    guarded = [p for p in layout.pointer_files if os.path.lexists(p) and os.path.realpath(p) == p]
    for git_dir in layout.repository_dirs:
        guarded += _prepared(git_dir, _GITDIR_GUARDED)
    for admin in layout.admin_dirs:
        guarded += _prepared(admin, _ADMIN_GUARDED)
    pinned: list[str] = []
    bound: list[str] = []
    for path in dict.fromkeys(guarded):
        # Only what lies inside a writable tree needs guarding.
        base = max((w for w in writable if _within(path, w) and path != w), key=len, default="")
        if not base:
            continue
        chain = []
        between = os.path.dirname(path)
        while between != base and _within(between, base):
            chain.append(between)
            between = os.path.dirname(between)
        pinned += reversed(chain)
        bound.append(path)
    args: list[str] = []
    for path in dict.fromkeys(pinned):
        args += ["--bind", path, path]
    for path in bound:
        args += ["--ro-bind", path, path]
    return args


def _prepared(git_dir: str, names: tuple[str, ...]) -> list[str]:
    """The guarded entries of one git directory (itself no symlink), those missing that can
    be made empty made so. A symlink is left out: the mount would land on its target and the
    link itself stay replaceable."""
    found = []
    for name in names:
        path = os.path.join(git_dir, name)
        if not os.path.lexists(path):
            # Another call on this repository may make it meanwhile: either way it is there.
            with contextlib.suppress(OSError):
                if name in _CREATED_DIRS:
                    os.mkdir(path)
                elif name in _CREATED_FILES:
                    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        try:
            if not stat.S_ISLNK(os.lstat(path).st_mode):
                found.append(path)
        except OSError:
            pass
    return found


@contextlib.contextmanager
def hold_git_placeholders(workspace_root: str, worktree: str | None) -> Iterator[None]:
    """For the length of one call, a commondir placeholder in each repository git directory
    the call may write, so that ``git_guard_args`` binds it read-only and a command cannot
    create one that sends the host's git to a planted configuration. The last call holding
    a placeholder removes it; one a killed worker left is adopted, then removed the same way."""
    taken = take_git_placeholders(workspace_root, worktree)
    try:
        yield
    finally:
        release_git_placeholders(taken)


def take_git_placeholders(workspace_root: str, worktree: str | None) -> list[str]:
    """``hold_git_placeholders``'s first half, for a holder that outlives one block (a
    sandbox started before its command); pass what it returns to ``release_git_placeholders``."""
    taken: list[str] = []
    with _placeholders_lock:
        for git_dir in _git_layout(workspace_root, worktree).repository_dirs:
            path = os.path.join(git_dir, "commondir")
            if _placeholders.get(path) or _place(path):
                _placeholders[path] = _placeholders.get(path, 0) + 1
                taken.append(path)
    return taken


def release_git_placeholders(taken: list[str]) -> None:
    with _placeholders_lock:
        for path in taken:
            _placeholders[path] -= 1
            if not _placeholders[path]:
                del _placeholders[path]
                with contextlib.suppress(OSError):
                    if _read_small(path) == _PLACEHOLDER:
                        os.unlink(path)


def _place(path: str) -> bool:
    """Whether a placeholder is at ``path`` now: made here, or left by an earlier worker."""
    if os.path.lexists(path):
        return not os.path.islink(path) and _read_small(path) == _PLACEHOLDER
    # Written beside it and linked into place, so git never sees the name empty.
    staged = f"{path}.sluice-{os.getpid()}-{threading.get_ident()}"
    try:
        with open(staged, "xb") as f:
            f.write(_PLACEHOLDER)
        os.link(staged, path)
        return True
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            os.unlink(staged)


def _read_small(path: str, limit: int = 4096) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return b""


def _subdirs(path: str) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(path) if e.is_dir(follow_symlinks=False))
    except OSError:
        return []


def _pointer(path: str) -> str:
    """The path in one of git's small pointer files, or "" when there is none."""
    text = _read_small(path).decode("utf-8", errors="replace").strip()
    return text.removeprefix("gitdir:").strip()


def _within(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip(os.sep) + os.sep)


def _hide(path: str) -> list[str]:
    """An empty tmpfs over a directory (made read-only by the caller, once mounts inside it
    are made)."""
    return ["--tmpfs", path] if os.path.isdir(path) else []


class SandboxUnavailable(RuntimeError):
    """bwrap is missing, or cannot create the namespaces a sandbox needs on this host."""


def worker_sandbox(
    *,
    base_dir: str,
    workspace_roots: list[str],
    credential_files: list[str] | None = None,
    shared_dirs: list[str] | None = None,
    home: str | None = None,
    path_env: str | None = None,
    limits: Limits | None = None,
) -> Sandbox:
    """The sandbox for a worker's commands, after a trial run proved it works here."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable("bwrap is not installed (Debian/Ubuntu: apt install bubblewrap)")
    failure = probe(bwrap)
    if failure is not None:
        raise SandboxUnavailable(f"a trial bwrap sandbox failed: {failure[:200]}")
    home = os.path.realpath(home if home is not None else os.path.expanduser("~"))
    # A credentials file is hidden with its whole directory: a bind over the file alone would
    # leave the temporary files a rotation writes beside it readable.
    secret_dirs = [os.path.dirname(os.path.realpath(f)) for f in credential_files or []]
    if "/" in secret_dirs:
        raise SandboxUnavailable("a credentials file directly under / cannot be hidden")
    hidden = [os.path.realpath(base_dir), *secret_dirs]
    hidden += [os.path.realpath(root) for root in workspace_roots]
    shown: list[str] = []
    if home == "/":
        home = ""
    else:
        # Tools installed under $HOME (pyenv, cargo, nvm) must keep working: the top
        # directory of each PATH entry there is shown again, and ~/.gitconfig for commits.
        for entry in (path_env if path_env is not None else os.environ.get("PATH", "")).split(":"):
            real = os.path.realpath(entry) if entry else ""
            if not real or not _within(real, home) or real == home:
                continue
            top = os.path.join(home, os.path.relpath(real, home).split(os.sep)[0])
            if not any(_within(h, top) for h in hidden) and top not in shown:
                shown.append(top)
        shown.append(os.path.join(home, ".gitconfig"))
    return Sandbox(
        bwrap=bwrap,
        prlimit=shutil.which("prlimit"),
        hidden=tuple(dict.fromkeys(hidden)),
        home=home or None,
        shown=tuple(shown),
        shared=tuple(os.path.realpath(d) for d in shared_dirs or []),
        limits=limits or Limits(),
    )


def probe(bwrap: str) -> str | None:
    """None when a trial sandbox (with its own network namespace) runs here, else why not."""
    trial = [bwrap, *NAMESPACES, "--unshare-net", "--die-with-parent", "--new-session"]
    trial += ["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "true"]
    try:
        done = subprocess.run(trial, capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode != 0:
        return done.stderr.decode("utf-8", errors="replace").strip() or f"exit {done.returncode}"
    return None
