"""Put this checkout on a Hugging Face Space: `python -m app.deploy --space OWNER/NAME
[--dry-run]`.

Uploads the files git tracks, as they are in the working tree, through the Hub's API (one
commit; files over 10 MB go up as large files), so it works whatever the git history holds
(a plain `git push` to a Space is refused for weights committed without LFS). Untracked and
ignored files, and anything a tracked link points to outside the checkout, stay here.

`--dry-run` lists the files, their sizes, the total and which ones are large, and touches
no network. The token is `HF_TOKEN`, else the one `hf auth login` saved.
"""

from __future__ import annotations

import argparse
import os
import re
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


def human_size(size: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:,} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def tracked_files(root: Path) -> list[TrackedFile]:
    """The files git tracks under `root` that exist in the working tree and lie inside it."""
    try:
        listing = subprocess.run(["git", "-C", str(root), "ls-files", "-z"],
                                 capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as err:
        raise DeployError(f"{root} is not a git checkout (git ls-files failed: {err}); "
                          "deploy from a clone of the repository.") from err
    root = root.resolve()
    files = []
    for name in sorted(filter(None, listing.decode("utf-8").split("\0"))):
        path = root / name
        if not path.is_file():  # deleted in the working tree, or a submodule
            continue
        if not path.resolve().is_relative_to(root):  # a link out of the checkout
            continue
        files.append(TrackedFile(name, path.stat().st_size))
    if not files:
        raise DeployError(f"git tracks no files in {root}: nothing to deploy.")
    return files


def plan_lines(files: list[TrackedFile], space: str) -> list[str]:
    """What a deploy would upload: one line a file, then the totals."""
    width = max(len(f.path) for f in files)
    lines = [f"{f.path:<{width}}  {human_size(f.size):>10}{'  large' if f.large else ''}"
             for f in files]
    large = [f for f in files if f.large]
    total = sum(f.size for f in files)
    lines.append(f"{len(files)} files, {human_size(total)} in all, to the Space {space}; "
                 f"{len(large)} large (over {human_size(LARGE_BYTES)}, uploaded as large "
                 f"files): {human_size(sum(f.size for f in large))}.")
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
        files = tracked_files(args.root)
    except DeployError as err:  # bad input: said before any work
        print(f"deploy: {err}", file=sys.stderr)
        return 2
    if args.dry_run:
        print("\n".join(plan_lines(files, args.space)))
        return 0
    try:
        endpoint = require_hub()  # first: offline, fail in seconds
        print("\n".join(plan_lines(files, args.space)))
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
