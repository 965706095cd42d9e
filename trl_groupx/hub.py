"""Share recipes: `trl-groupx recipe push | pull | check`.

    trl-groupx recipe push recipes/gmpo.yaml me/qwen-gmpo            # uploads to me/qwen-gmpo:recipe.yaml
    trl-groupx recipe pull me/qwen-gmpo --dest recipes/              # Hub repo (file recipe.yaml)
    trl-groupx recipe pull me/qwen-gmpo:recipes/gmpo.yaml            # Hub repo, another file in it
    trl-groupx recipe pull ./some/folder --path gmpo.yaml            # local folder (or a .yaml file directly)
    trl-groupx recipe pull https://github.com/me/recipes.git --path gmpo.yaml   # git URL (cloned with `git`)
    trl-groupx recipe check recipes/gmpo.yaml                        # the same checks on a local file

Where recipes live on the Hub: in a **model** repository by default (`--repo_type dataset` also works). A recipe
describes how a model was trained, so its natural home is the trained model's own repository, next to the weights
and the model card (which names the recipe); the default file name in the repository is `recipe.yaml`.

Loading a recipe someone else wrote never executes code (`load_recipe`, run by `pull` before anything is written
and by `push` before anything is uploaded):

- the file must be a regular file (no symlink out of the source), at most `MAX_RECIPE_BYTES` (1 MB), UTF-8;
- YAML is parsed with `yaml.safe_load`, and before that every YAML tag (`!!python/object`, `!!str`, `!custom`),
  anchor/alias (`&a` / `*a`, the "billion laughs" expansion) and `%TAG` directive is refused, as are duplicate keys;
- the top level must be a mapping of known fields of `trl-groupx grpo` (`GRPOScriptArguments`, `trl_groupx.GRPOConfig`,
  `trl.ModelConfig`); an unknown field is an error naming the closest known ones;
- fields that would hand the recipe's author code execution or the user's environment are refused: `env` (TRL would
  export it into `os.environ`), `allow_reward_imports` (only the user opts in, on the command line),
  `trust_remote_code: true` (here or in `model_init_kwargs`; `--allow_remote_code` to accept), and an `output_dir`
  that is absolute or climbs out with `..`;
- `reward_funcs` resolve by registered name only (`trl_groupx.script.REWARD_FUNCS`); a dotted import path such as
  `os.system` is refused unless the user passes `--allow_reward_imports` (and even then it is not imported here);
- the values are finally validated by constructing the configs exactly as `trl-groupx grpo` does
  (`trl_groupx.script.make_parser().parse_args_and_config`), so a bad value or a contradictory combination of variant
  flags fails at pull time with the config's own message.

Git sources are cloned with `git clone --depth 1 -- URL DIR` through `subprocess` (no shell) into a temporary folder,
with `GIT_ALLOW_PROTOCOL=file:git:http:https:ssh` (so `ext::` and other command-running transports are refused),
no terminal prompt and a timeout; the URL may not start with `-`.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

MAX_RECIPE_BYTES = 1_000_000
DEFAULT_PATH_IN_REPO = "recipe.yaml"
DEFAULT_REPO_TYPE = "model"
REPO_TYPES = ("model", "dataset")
GIT_TIMEOUT_S = 300
GIT_PROTOCOLS = "file:git:http:https:ssh"

_GIT_URL = re.compile(r"^(https?://|ssh://|git://|file://|[\w.-]+@[\w.-]+:)")
_REPO_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")
_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
# Fields a recipe from elsewhere may not set (see the module docstring).
_FORBIDDEN_FIELDS = {
    "env": "a recipe may not set environment variables (TRL would export them into this process); set them yourself",
    "allow_reward_imports": "only you can allow reward imports: pass --allow_reward_imports on the command line",
}


class RecipeError(ValueError):
    """A recipe that cannot be loaded safely or does not validate; the message says which field and why."""


# ---- loading and validating ------------------------------------------------------------------------------------


def read_recipe_text(path: str | os.PathLike, *, root: str | os.PathLike | None = None) -> str:
    """The recipe's text after the file checks: regular file (inside `root` if given), size, UTF-8."""
    path = Path(path)
    if root is not None:
        root_resolved = Path(root).resolve()
        if path.is_symlink() or not path.resolve().is_relative_to(root_resolved):
            raise RecipeError(f"{path}: the recipe is a symlink or lies outside its source {root}; refused.")
    if not path.is_file():
        raise RecipeError(f"{path}: no such recipe file.")
    size = path.stat().st_size
    if size > MAX_RECIPE_BYTES:
        raise RecipeError(f"{path}: {size} bytes; a recipe may be at most {MAX_RECIPE_BYTES} bytes (1 MB). Refused.")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise RecipeError(f"{path}: not UTF-8 text ({err}).") from None


def parse_recipe_yaml(text: str, name: str = "recipe") -> dict[str, Any]:
    """Safely parse a recipe's YAML: no tags, anchors, aliases, directives or duplicate keys; a top-level mapping."""
    if len(text.encode("utf-8")) > MAX_RECIPE_BYTES:
        raise RecipeError(f"{name}: larger than {MAX_RECIPE_BYTES} bytes (1 MB). Refused.")
    try:
        for token in yaml.scan(text, Loader=yaml.SafeLoader):
            line = token.start_mark.line + 1
            if isinstance(token, yaml.TagToken):
                tag = "".join(token.value)
                raise RecipeError(f"{name}, line {line}: YAML tag {tag!r} refused; recipes are plain YAML without tags.")
            if isinstance(token, (yaml.AnchorToken, yaml.AliasToken)):
                raise RecipeError(f"{name}, line {line}: YAML anchors and aliases (&{token.value} / *{token.value}) "
                                  "are refused in recipes; write the value out.")
            if isinstance(token, yaml.DirectiveToken):
                raise RecipeError(f"{name}, line {line}: YAML directive %{token.name} refused.")
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is not None and isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for key_node, _ in node.value:
                if key_node.value in seen:
                    raise RecipeError(f"{name}, line {key_node.start_mark.line + 1}: field {key_node.value!r} is set "
                                      "twice; refused (which one would win is easy to miss).")
                seen.add(key_node.value)
        config = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise RecipeError(f"{name}: not valid YAML: {err}") from None
    if not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
        raise RecipeError(f"{name}: a recipe must be a YAML mapping of field names to values.")
    return config


def _known_fields(parser) -> set[str]:
    return {a.dest for a in parser._actions if a.dest not in ("help", argparse.SUPPRESS)}


def check_recipe_fields(
    config: dict[str, Any],
    known: set[str],
    *,
    allow_reward_imports: bool = False,
    allow_remote_code: bool = False,
    name: str = "recipe",
) -> None:
    """Field-level safety checks: unknown and forbidden fields, remote code, output_dir, reward names."""
    for key, why in _FORBIDDEN_FIELDS.items():
        if key in config:
            raise RecipeError(f"{name}: field {key!r} refused: {why}.")
    unknown = sorted(set(config) - known)
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, sorted(known), n=3)
            hints.append(f"{key!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
        raise RecipeError(f"{name}: unknown field(s) {', '.join(hints)}; a recipe holds only fields of "
                          "trl-groupx grpo (GRPOScriptArguments, trl_groupx.GRPOConfig, trl.ModelConfig).")
    init_kwargs = config.get("model_init_kwargs")
    remote = config.get("trust_remote_code") is True or (
        isinstance(init_kwargs, dict) and init_kwargs.get("trust_remote_code") is True
    )
    if remote and not allow_remote_code:
        raise RecipeError(f"{name}: trust_remote_code: true would run the model repository's Python code; refused. "
                          "Pass --allow_remote_code if you trust it.")
    output_dir = config.get("output_dir")
    if isinstance(output_dir, str) and (os.path.isabs(output_dir) or ".." in Path(output_dir).parts
                                        or output_dir.startswith("~")):
        raise RecipeError(f"{name}: output_dir={output_dir!r} points outside the working folder; refused. Use a "
                          "relative path (or override it with --output_dir when you train).")
    rewards = config.get("reward_funcs", [])
    rewards = [rewards] if isinstance(rewards, str) else rewards
    if not isinstance(rewards, list) or not all(isinstance(r, str) for r in rewards):
        raise RecipeError(f"{name}: reward_funcs must be a list of reward names.")
    from .script import _reward_funcs

    registered = _reward_funcs()
    for reward in rewards:
        if reward in registered:
            continue
        if _DOTTED.match(reward):
            if allow_reward_imports:
                continue
            raise RecipeError(f"{name}: reward_funcs entry {reward!r} is an import path, not a registered reward; "
                              "importing it would run its code. Refused; pass --allow_reward_imports if you trust it. "
                              f"Registered rewards: {sorted(registered)}.")
        raise RecipeError(f"{name}: reward_funcs entry {reward!r} is not a registered reward; registered: "
                          f"{sorted(registered)}.")


def load_recipe(
    path: str | os.PathLike,
    *,
    allow_reward_imports: bool = False,
    allow_remote_code: bool = False,
    root: str | os.PathLike | None = None,
) -> tuple[dict[str, Any], tuple[Any, Any, Any]]:
    """Load and validate a recipe without executing any of its content.

    Returns the parsed mapping and `(script_args, training_args, model_args)` as `trl-groupx grpo` would build them.
    Raises `RecipeError` with a message naming the problem.
    """
    from .script import make_parser

    name = str(path)
    config = parse_recipe_yaml(read_recipe_text(path, root=root), name)
    parser = make_parser()
    check_recipe_fields(config, _known_fields(parser), allow_reward_imports=allow_reward_imports,
                        allow_remote_code=allow_remote_code, name=name)
    # A throw-away output_dir: validation creates nothing, whatever the recipe says; use_cpu lets bf16 recipes
    # validate on a machine without a GPU (it changes no other field).
    argv = ["--config", str(path), "--use_cpu", "true", "--output_dir", tempfile.gettempdir()]
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            parsed = parser.parse_args_and_config(argv)
    except SystemExit:
        lines = [line for line in stderr.getvalue().splitlines() if line.strip()]
        raise RecipeError(f"{name}: does not parse as trl-groupx grpo arguments: {lines[-1] if lines else ''}") \
            from None
    except (ValueError, TypeError) as err:
        raise RecipeError(f"{name}: invalid configuration: {err}") from None
    return config, tuple(parsed)


# ---- sources ---------------------------------------------------------------------------------------------------


def classify_source(source: str) -> str:
    """`"git"`, `"local"` or `"hub"` for a pull source (local wins over a Hub id when the path exists)."""
    if _GIT_URL.match(source) or "::" in source or (source.endswith(".git") and not os.path.exists(source)):
        return "git"
    if os.path.exists(source) or source.startswith((".", "/", "~")):
        return "local"
    repo_id = source.split(":", 1)[0]
    if _REPO_ID.match(repo_id):
        return "hub"
    raise RecipeError(f"{source!r} is not a Hub repo id (owner/name[:path.yaml]), an existing folder or a git URL.")


def _safe_relative(path: str) -> str:
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or not pure.parts:
        raise RecipeError(f"path {path!r} must be a relative path inside the source, without '..'.")
    if pure.suffix not in (".yaml", ".yml"):
        raise RecipeError(f"path {path!r}: a recipe is a .yaml or .yml file.")
    return str(pure)


def _find_in_folder(folder: Path, path: str | None) -> Path:
    if path is not None:
        return folder / _safe_relative(path)
    if (folder / DEFAULT_PATH_IN_REPO).exists():
        return folder / DEFAULT_PATH_IN_REPO
    candidates = sorted(p for p in folder.rglob("*.y*ml") if ".git" not in p.relative_to(folder).parts)
    if len(candidates) == 1:
        return candidates[0]
    listed = ", ".join(str(p.relative_to(folder)) for p in candidates[:20]) or "none"
    raise RecipeError(f"{folder}: no {DEFAULT_PATH_IN_REPO}, and {len(candidates)} YAML files ({listed}); "
                      "name one with --path.")


def _endpoint(endpoint: str | None) -> str | None:
    return endpoint or os.environ.get("HF_ENDPOINT") or None


def git_clone(url: str, into: Path, revision: str | None = None) -> Path:
    """Shallow-clone `url` into `into` with `git` (no shell, restricted transports, no prompt, timeout)."""
    if url.startswith("-") or (revision is not None and revision.startswith("-")):
        raise RecipeError(f"git source {url!r}: refused (a URL or revision may not start with '-').")
    if url.startswith(("ext::", "fd::")) or "::" in url.split("/", 1)[0]:
        raise RecipeError(f"git source {url!r}: transport refused; use https://, ssh://, git:// or file://.")
    git = shutil.which("git")
    if git is None:
        raise RecipeError("pulling from a git URL needs the `git` program, which is not installed.")
    env = {**os.environ, "GIT_ALLOW_PROTOCOL": GIT_PROTOCOLS, "GIT_TERMINAL_PROMPT": "0"}
    cmd = [git, "-c", "core.hooksPath=/dev/null", "clone", "--depth", "1", "--no-tags", "--quiet"]
    if revision:
        cmd += ["--branch", revision]
    cmd += ["--", url, str(into)]
    try:
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise RecipeError(f"git clone {url!r} took longer than {GIT_TIMEOUT_S}s; aborted.") from None
    if result.returncode != 0:
        raise RecipeError(f"git clone {url!r} failed: {result.stderr.strip()}")
    return into


def _copy_out(src: Path, dest: str | os.PathLike, force: bool) -> Path:
    dest = Path(dest)
    target = dest / src.name if dest.is_dir() or str(dest).endswith(os.sep) or not dest.suffix else dest
    if target.exists() and not force:
        raise RecipeError(f"{target} already exists; pass --force to overwrite it.")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, target)
    return target


def pull_recipe(
    source: str,
    *,
    dest: str | os.PathLike = ".",
    path: str | None = None,
    revision: str | None = None,
    repo_type: str = DEFAULT_REPO_TYPE,
    token: str | None = None,
    endpoint: str | None = None,
    allow_reward_imports: bool = False,
    allow_remote_code: bool = False,
    force: bool = False,
) -> Path:
    """Fetch a recipe from a Hub repo (`owner/name` or `owner/name:path.yaml`), a local folder or file, or a git
    URL; validate it (`load_recipe`) and only then copy it to `dest` (a folder, or a file path ending in .yaml).
    Returns the written path."""
    kind = classify_source(source)
    checks = {"allow_reward_imports": allow_reward_imports, "allow_remote_code": allow_remote_code}
    with tempfile.TemporaryDirectory(prefix="trl_groupx_recipe_") as tmp:
        if kind == "local":
            local = Path(source).expanduser()
            if local.is_dir():
                recipe, root = _find_in_folder(local, path), local
            else:
                recipe, root = local, local.parent
            load_recipe(recipe, root=root, **checks)
        elif kind == "git":
            root = git_clone(source, Path(tmp) / "clone", revision)
            recipe = _find_in_folder(root, path)
            load_recipe(recipe, root=root, **checks)
        else:
            repo_id, _, in_repo = source.partition(":")
            in_repo = _safe_relative(in_repo or path or DEFAULT_PATH_IN_REPO)
            recipe = _hub_download(repo_id, in_repo, repo_type=repo_type, revision=revision, token=token,
                                   endpoint=endpoint, cache_dir=Path(tmp) / "cache")
            load_recipe(recipe, **checks)
        return _copy_out(recipe, dest, force)


def _hub_download(repo_id, filename, *, repo_type, revision, token, endpoint, cache_dir) -> Path:
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url

    if repo_type not in REPO_TYPES:
        raise RecipeError(f"repo_type={repo_type!r}; use one of {REPO_TYPES}.")
    endpoint = _endpoint(endpoint)
    # the size is known from the HEAD request before anything is downloaded
    url = hf_hub_url(repo_id, filename, repo_type=repo_type, revision=revision, endpoint=endpoint)
    meta = get_hf_file_metadata(url, token=token, endpoint=endpoint)
    if meta.size is not None and meta.size > MAX_RECIPE_BYTES:
        raise RecipeError(f"{repo_id}:{filename}: {meta.size} bytes; a recipe may be at most {MAX_RECIPE_BYTES} "
                          "bytes (1 MB). Refused before downloading.")
    return Path(hf_hub_download(repo_id, filename, repo_type=repo_type, revision=revision, token=token,
                                endpoint=endpoint, cache_dir=str(cache_dir)))


def push_recipe(
    recipe: str | os.PathLike,
    repo_id: str,
    *,
    path_in_repo: str = DEFAULT_PATH_IN_REPO,
    repo_type: str = DEFAULT_REPO_TYPE,
    revision: str | None = None,
    token: str | None = None,
    endpoint: str | None = None,
    private: bool | None = None,
    create_repo: bool = True,
    commit_message: str | None = None,
    allow_reward_imports: bool = False,
    allow_remote_code: bool = False,
) -> str:
    """Validate `recipe` (the checks of `load_recipe`) and upload it to `repo_id` at `path_in_repo`, creating the
    repository if needed. Returns the commit URL."""
    from huggingface_hub import HfApi

    if repo_type not in REPO_TYPES:
        raise RecipeError(f"repo_type={repo_type!r}; use one of {REPO_TYPES}.")
    if not _REPO_ID.match(repo_id):
        raise RecipeError(f"{repo_id!r} is not a Hub repo id (owner/name).")
    path_in_repo = _safe_relative(path_in_repo)
    load_recipe(recipe, allow_reward_imports=allow_reward_imports, allow_remote_code=allow_remote_code)
    api = HfApi(endpoint=_endpoint(endpoint), token=token)
    if create_repo:
        api.create_repo(repo_id, repo_type=repo_type, private=private, exist_ok=True)
    info = api.upload_file(
        path_or_fileobj=str(recipe),
        path_in_repo=path_in_repo,
        repo_id=repo_id,
        repo_type=repo_type,
        revision=revision,
        commit_message=commit_message or f"Upload trl-groupx recipe {Path(recipe).name}",
    )
    return str(info.commit_url if hasattr(info, "commit_url") else info)


# ---- command line ----------------------------------------------------------------------------------------------


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow_reward_imports", action="store_true",
                   help="accept dotted import paths in reward_funcs (they run code when you train)")
    p.add_argument("--allow_remote_code", action="store_true", help="accept trust_remote_code: true")


def _add_hub(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repo_type", choices=REPO_TYPES, default=DEFAULT_REPO_TYPE)
    p.add_argument("--revision", default=None, help="Hub revision, or git branch/tag")
    p.add_argument("--token", default=None, help="Hub token (default: HF_TOKEN / the cached login)")
    p.add_argument("--endpoint", default=None, help="Hub endpoint (default: HF_ENDPOINT or huggingface.co)")


def make_recipe_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trl-groupx recipe", description="Share recipes on the Hub, check them.")
    sub = parser.add_subparsers(dest="action", required=True)
    push = sub.add_parser("push", help="validate a recipe and upload it to a Hub repository")
    push.add_argument("recipe")
    push.add_argument("repo_id")
    push.add_argument("--path_in_repo", default=DEFAULT_PATH_IN_REPO)
    push.add_argument("--private", action="store_true", default=None)
    _add_hub(push)
    _add_common(push)
    pull = sub.add_parser("pull", help="fetch a recipe (Hub repo[:path], local folder or git URL) and validate it")
    pull.add_argument("source")
    pull.add_argument("--dest", default=".", help="folder (or .yaml path) to write the recipe to")
    pull.add_argument("--path", default=None, help="the recipe's path inside the source")
    pull.add_argument("--force", action="store_true", help="overwrite an existing file at the destination")
    _add_hub(pull)
    _add_common(pull)
    check = sub.add_parser("check", help="run the pull-time safety checks and validation on a local recipe")
    check.add_argument("recipe")
    _add_common(check)
    return parser


def main(argv: list[str] | None = None) -> None:
    ns = make_recipe_parser().parse_args(sys.argv[1:] if argv is None else argv)
    checks = {"allow_reward_imports": ns.allow_reward_imports, "allow_remote_code": ns.allow_remote_code}
    try:
        if ns.action == "push":
            url = push_recipe(ns.recipe, ns.repo_id, path_in_repo=ns.path_in_repo, repo_type=ns.repo_type,
                              revision=ns.revision, token=ns.token, endpoint=ns.endpoint, private=ns.private,
                              **checks)
            print(f"Pushed {ns.recipe} to {ns.repo_id}:{ns.path_in_repo} ({url}).")
        elif ns.action == "pull":
            target = pull_recipe(ns.source, dest=ns.dest, path=ns.path, revision=ns.revision,
                                 repo_type=ns.repo_type, token=ns.token, endpoint=ns.endpoint, force=ns.force,
                                 **checks)
            print(f"Recipe validated and written to {target}. Train with: trl-groupx grpo --config {target}")
        else:
            _, (_, training_args, _) = load_recipe(ns.recipe, **checks)
            active = training_args.active_variants()
            print(f"{ns.recipe}: OK; variants: {active or 'none (plain GRPO)'}.")
    except RecipeError as err:
        raise SystemExit(f"error: {err}") from None
