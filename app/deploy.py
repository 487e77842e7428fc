"""Put this checkout on a Hugging Face Space: `python -m app.deploy --space OWNER/NAME
[--dry-run]`.

Uploads the files git tracks, as they are in the working tree, through the Hub's API (one
commit; files over 10 MB go up as large files), so it works whatever the git history holds
(a plain `git push` to a Space is refused for weights committed without LFS). Untracked and
ignored files stay here, and so does every symbolic link: the upload would send the bytes
of whatever a link points to, which git does not track (an `.env` with a token, say).

`--dry-run` lists the files, their sizes, the total and which ones are large, then the
tracked paths skipped because they are links, and touches no network. The token is
`HF_TOKEN`, else the one `hf auth login` saved.
"""

from __future__ import annotations

import argparse
import os
import re
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LARGE_BYTES = 10 * 1024 * 1024  # a Space refuses a plain git push of a bigger file
SPACE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


class DeployError(Exception):
    """What stops a deploy, worded for the person running it."""


@dataclass(frozen=True)
class TrackedFile:
    path: str  # relative to the checkout, with forward slashes: the path in the Space
    size: int

    @property
    def large(self) -> bool:
        return self.size > LARGE_BYTES


@dataclass(frozen=True)
class SkippedFile:
    path: str  # as git tracks it
    reason: str


@dataclass(frozen=True)
class Checkout:
    files: list[TrackedFile]  # what a deploy uploads
    skipped: list[SkippedFile]  # tracked paths it leaves out, and why


def human_size(size: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:,} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def link_in_path(root: Path, name: str) -> str | None:
    """The first part of `name` (a path under `root`) that is a symbolic link, or None.

    Each part is checked without following it: a tracked file under a directory that was
    later swapped for a link would be read through the link just the same."""
    part = root
    for piece in name.split("/"):
        part = part / piece
        try:
            if stat.S_ISLNK(os.lstat(part).st_mode):
                return str(part.relative_to(root))
        except OSError:
            return None  # missing: not a link, and not a file either
    return None


def _skip_reason(name: str, link: str) -> str:
    if link == name:
        return "a symbolic link: links are not uploaded (the Space would get the bytes " \
               "of what it points to)"
    return f"under the symbolic link {link}: links are not uploaded"


def scan_checkout(root: Path) -> Checkout:
    """The files git tracks under `root` that exist in the working tree as regular files
    reached through no symbolic link, and the tracked paths skipped for being links."""
    try:
        listing = subprocess.run(["git", "-C", str(root), "ls-files", "-z"],
                                 capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as err:
        raise DeployError(f"{root} is not a git checkout (git ls-files failed: {err}); "
                          "deploy from a clone of the repository.") from err
    root = root.resolve()
    files, skipped = [], []
    for name in sorted(filter(None, listing.decode("utf-8").split("\0"))):
        link = link_in_path(root, name)
        if link is not None:  # wherever it points, in the checkout or out of it
            skipped.append(SkippedFile(name, _skip_reason(name, link)))
            continue
        try:
            info = os.lstat(root / name)
        except OSError:  # deleted in the working tree
            continue
        if not stat.S_ISREG(info.st_mode):  # a submodule, a fifo
            continue
        files.append(TrackedFile(name, info.st_size))
    if not files:
        raise DeployError(f"git tracks no files in {root}: nothing to deploy.")
    return Checkout(files, skipped)


def tracked_files(root: Path) -> list[TrackedFile]:
    """What a deploy of `root` uploads (see `scan_checkout`)."""
    return scan_checkout(root).files


def plan_lines(files: list[TrackedFile], space: str,
               skipped: list[SkippedFile] | None = None) -> list[str]:
    """What a deploy would upload: one line a file, then the totals; then the tracked
    paths it skips, with the reason."""
    width = max(len(f.path) for f in files)
    lines = [f"{f.path:<{width}}  {human_size(f.size):>10}{'  large' if f.large else ''}"
             for f in files]
    large = [f for f in files if f.large]
    total = sum(f.size for f in files)
    lines.append(f"{len(files)} files, {human_size(total)} in all, to the Space {space}; "
                 f"{len(large)} large (over {human_size(LARGE_BYTES)}, uploaded as large "
                 f"files): {human_size(sum(f.size for f in large))}.")
    if skipped:
        lines.append(f"Skipped {len(skipped)} tracked path{'s' * (len(skipped) != 1)}, "
                     "not uploaded:")
        lines += [f"  {s.path}  ({s.reason})" for s in skipped]
    return lines


def require_hub(timeout: float = 3.0) -> str:
    """The Hub's address when it answers within `timeout` seconds; DeployError otherwise."""
    from huggingface_hub import constants

    from agent.models import hub_reachable

    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        raise DeployError(f"HF_HUB_OFFLINE is set, so the Hugging Face Hub "
                          f"({constants.ENDPOINT}) is not contacted: unset it and run again "
                          "where the Hub is reachable.")
    if not hub_reachable(timeout):
        raise DeployError(f"The Hugging Face Hub ({constants.ENDPOINT}) cannot be reached "
                          f"from this machine (no answer in {timeout:g} s): run the deploy "
                          "where there is internet. Nothing was uploaded.")
    return constants.ENDPOINT


def hub_token() -> str:
    from huggingface_hub import get_token

    token = get_token()  # HF_TOKEN, else the saved login
    if not token:
        raise DeployError("No Hugging Face token: set HF_TOKEN to a token with write access, "
                          "or run `hf auth login`.")
    return token


def upload(api, root: Path, files: list[TrackedFile], space: str) -> str:
    """Create the Space if needed and upload `files` in one commit; the commit's address.

    `api` is a `huggingface_hub.HfApi` (the tests pass a recorder in its place)."""
    from huggingface_hub import CommitOperationAdd

    # Checked again here, before anything is sent: a file may have been swapped for a link
    # since it was listed, and `files` may come from elsewhere than `scan_checkout`.
    for f in files:
        link = link_in_path(root, f.path)
        if link is not None:
            where = f"{f.path} is" if link == f.path else f"{f.path} lies under {link},"
            raise DeployError(f"{where} a symbolic link now, and links are not uploaded; run "
                              "the deploy again. Nothing was uploaded.")
    api.create_repo(space, repo_type="space", space_sdk="gradio", exist_ok=True)
    operations = [CommitOperationAdd(path_in_repo=f.path, path_or_fileobj=str(root / f.path))
                  for f in files]
    info = api.create_commit(space, operations, repo_type="space",
                             commit_message="Deploy the studio (python -m app.deploy)")
    return str(getattr(info, "commit_url", info))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m app.deploy",
        description="Upload the files git tracks in this checkout to a Hugging Face Space.")
    parser.add_argument("--space", required=True, metavar="OWNER/NAME",
                        help="the Space to create or update, e.g. me/llds-studio")
    parser.add_argument("--dry-run", action="store_true",
                        help="list what would be uploaded, with sizes; contact nothing")
    parser.add_argument("--root", type=Path, default=ROOT,
                        help="the checkout to deploy (default: this one)")
    args = parser.parse_args(argv)
    if not SPACE_ID.match(args.space) or ".." in args.space:
        parser.error(f"--space {args.space!r} is not OWNER/NAME (letters, digits, '-', '_', "
                     "'.'): name the Space as in its address, e.g. me/llds-studio.")
    if not args.root.is_dir():
        parser.error(f"--root {args.root} is not a directory: name the checkout to deploy.")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        checkout = scan_checkout(args.root)
    except DeployError as err:  # bad input: said before any work
        print(f"deploy: {err}", file=sys.stderr)
        return 2
    files = checkout.files
    if args.dry_run:
        print("\n".join(plan_lines(files, args.space, checkout.skipped)))
        return 0
    try:
        endpoint = require_hub()  # first: offline, fail in seconds
        print("\n".join(plan_lines(files, args.space, checkout.skipped)))
        from huggingface_hub import HfApi

        url = upload(HfApi(endpoint=endpoint, token=hub_token()), args.root.resolve(), files,
                     args.space)
    except DeployError as err:
        print(f"deploy: {err}", file=sys.stderr)
        return 1
    except Exception as err:  # the Hub refused (rights, name, quota): say what it said
        print(f"deploy: the Hugging Face Hub refused the upload: {type(err).__name__}: {err}",
              file=sys.stderr)
        return 1
    print(f"Deployed: {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
