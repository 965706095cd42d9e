"""Recipe sharing (`trl-groupx recipe push | pull | check`, trl_groupx/hub.py).

Hub push/pull run against `tests/unit/hub_standin.py`: a local STAND-IN HTTP server (http.server in a thread on
127.0.0.1) that speaks the subset of the Hugging Face Hub HTTP API that huggingface_hub uses for create_repo,
upload_file and hf_hub_download. It is not the Hub: these tests check that our calls work against that API shape,
not against huggingface.co. Git pulls clone a local bare repository through a file:// URL.
"""

import socket
import subprocess
from pathlib import Path

import pytest

from trl_groupx.cli import main
from trl_groupx.hub import (
    MAX_RECIPE_BYTES,
    RecipeError,
    classify_source,
    load_recipe,
    parse_recipe_yaml,
    pull_recipe,
    push_recipe,
)

from .hub_standin import HubStandIn

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
GMPO = RECIPES / "gmpo.yaml"
TOKEN = "hf_standin_token"


@pytest.fixture
def hub(monkeypatch):
    """The stand-in Hub, with huggingface_hub pointed at it (conftest sets HF_HUB_OFFLINE=1 for all tests)."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    real_getaddrinfo = socket.getaddrinfo

    def local_only(host, *args, **kwargs):  # any request meant for another host fails the test instead of leaving
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise AssertionError(f"test tried to reach {host!r}; only the stand-in Hub on 127.0.0.1 is allowed")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", local_only)
    with HubStandIn() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        # requests huggingface_hub makes on its own (agent registry, telemetry) go to the stand-in too, never out
        # (as HF_ENDPOINT set before huggingface_hub is imported would: constants derived from it at import follow)
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", server.url)
        monkeypatch.setattr(huggingface_hub.constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                            server.url + "/{repo_id}/resolve/{revision}/{filename}")
        yield server


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# ---- Hub push / pull (stand-in server) -------------------------------------------------------------------------


def test_push_then_pull_roundtrip_through_the_standin_hub(hub, tmp_path):
    url = push_recipe(GMPO, "alice/qwen-gmpo", token=TOKEN)  # endpoint from HF_ENDPOINT
    assert url.startswith(f"{hub.url}/alice/qwen-gmpo/commit/")
    assert hub.repos[("model", "alice/qwen-gmpo")]["recipe.yaml"] == GMPO.read_bytes()
    assert set(hub.auth_headers) == {f"Bearer {TOKEN}"} and not hub.unknown  # every request was one it knows

    written = pull_recipe("alice/qwen-gmpo", dest=tmp_path / "got", token=TOKEN)
    assert written == tmp_path / "got" / "recipe.yaml" and written.read_bytes() == GMPO.read_bytes()
    _, (_, training_args, _) = load_recipe(written)
    assert training_args.active_variants() == {"objective": "gmpo"}
    with pytest.raises(RecipeError, match="already exists; pass --force"):
        pull_recipe("alice/qwen-gmpo", dest=tmp_path / "got", token=TOKEN)


def test_cli_push_and_pull_a_path_in_a_dataset_repo(hub, tmp_path, capsys):
    main(["recipe", "push", str(GMPO), "bob/recipes", "--path_in_repo", "grpo/gmpo.yaml", "--repo_type", "dataset",
          "--token", TOKEN, "--endpoint", hub.url])
    assert "Pushed" in capsys.readouterr().out
    assert ("dataset", "bob/recipes") in hub.repos
    main(["recipe", "pull", "bob/recipes:grpo/gmpo.yaml", "--repo_type", "dataset", "--dest", str(tmp_path),
          "--token", TOKEN])
    assert (tmp_path / "gmpo.yaml").read_bytes() == GMPO.read_bytes()
    assert "trl-groupx grpo --config" in capsys.readouterr().out
    # pushing again to an existing repo is fine (create_repo exist_ok)
    push_recipe(GMPO, "bob/recipes", path_in_repo="other.yaml", repo_type="dataset", token=TOKEN)
    assert set(hub.repos[("dataset", "bob/recipes")]) == {"grpo/gmpo.yaml", "other.yaml"}


def test_hub_pull_refuses_a_10mb_file_before_downloading_it(hub, tmp_path):
    hub.repos[("model", "eve/huge")] = {"recipe.yaml": b"a: 1\n" * (2 * 1024 * 1024)}  # 10 MiB
    with pytest.raises(RecipeError, match="at most 1000000 bytes.*before downloading"):
        pull_recipe("eve/huge", dest=tmp_path, token=TOKEN)
    assert not list(tmp_path.iterdir())


def test_hub_pull_refuses_a_malicious_recipe_and_writes_nothing(hub, tmp_path):
    hub.repos[("model", "eve/evil")] = {"recipe.yaml": b"reward_funcs: [os.system]\n"}
    with pytest.raises(RecipeError, match="'os.system' is an import path.*--allow_reward_imports"):
        pull_recipe("eve/evil", dest=tmp_path, token=TOKEN)
    assert not list(tmp_path.iterdir())


def test_push_refuses_an_invalid_recipe_before_uploading(hub, tmp_path):
    bad = _write(tmp_path / "bad.yaml", "loss_type: gmpo\ngmpo_clipp: 0.4\n")
    with pytest.raises(RecipeError, match="unknown field.*'gmpo_clipp' \\(did you mean gmpo_clip"):
        push_recipe(bad, "alice/x", token=TOKEN)
    assert hub.repos == {}


# ---- local folder and git sources ------------------------------------------------------------------------------


def test_pull_from_a_local_folder(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    (folder / "gmpo.yaml").write_bytes(GMPO.read_bytes())
    written = pull_recipe(str(folder), dest=tmp_path / "out")  # the only YAML file in the folder
    assert written.read_bytes() == GMPO.read_bytes()
    (folder / "other.yaml").write_bytes((RECIPES / "dapo.yaml").read_bytes() if (RECIPES / "dapo.yaml").exists()
                                        else GMPO.read_bytes())
    with pytest.raises(RecipeError, match="2 YAML files.*--path"):
        pull_recipe(str(folder), dest=tmp_path / "out2")
    written = pull_recipe(str(folder), path="gmpo.yaml", dest=tmp_path / "named.yaml")
    assert written == tmp_path / "named.yaml"
    with pytest.raises(RecipeError, match="without '..'"):
        pull_recipe(str(folder), path="../gmpo.yaml", dest=tmp_path / "out3")


def test_pull_refuses_a_symlink_out_of_the_source(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    secret = _write(tmp_path / "secret.yaml", "loss_type: gmpo\n")
    (folder / "recipe.yaml").symlink_to(secret)
    with pytest.raises(RecipeError, match="symlink or lies outside"):
        pull_recipe(str(folder), dest=tmp_path / "out")


def _git(*args, cwd=None):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main",
                    *args], cwd=cwd, check=True, capture_output=True)


def test_pull_from_a_git_url(tmp_path):
    bare, work = tmp_path / "recipes.git", tmp_path / "work"
    _git("init", "--bare", str(bare))
    _git("init", str(work))
    (work / "recipes").mkdir()
    (work / "recipes" / "gmpo.yaml").write_bytes(GMPO.read_bytes())
    _git("add", ".", cwd=work)
    _git("commit", "-m", "recipe", cwd=work)
    _git("push", str(bare), "HEAD:refs/heads/main", cwd=work)

    url = bare.as_uri()  # file:///.../recipes.git
    assert classify_source(url) == "git"
    written = pull_recipe(url, dest=tmp_path / "out")  # the only YAML file in the clone
    assert written == tmp_path / "out" / "gmpo.yaml" and written.read_bytes() == GMPO.read_bytes()
    main(["recipe", "pull", url, "--path", "recipes/gmpo.yaml", "--revision", "main", "--dest",
          str(tmp_path / "cli.yaml")])
    assert (tmp_path / "cli.yaml").read_bytes() == GMPO.read_bytes()
    with pytest.raises(RecipeError, match="git clone .* failed"):
        pull_recipe(url, revision="no-such-branch", dest=tmp_path / "out4")


def test_git_sources_that_could_run_commands_are_refused(tmp_path):
    marker = tmp_path / "pwned"
    with pytest.raises(RecipeError, match="transport refused"):
        pull_recipe(f"ext::sh -c touch% {marker}", dest=tmp_path / "out")
    with pytest.raises(RecipeError, match="not a Hub repo id"):
        pull_recipe(f"--upload-pack=touch {marker}", dest=tmp_path / "out")
    with pytest.raises(RecipeError, match="may not start with '-'"):
        from trl_groupx.hub import git_clone

        git_clone(f"--upload-pack=touch {marker}", tmp_path / "clone")
    with pytest.raises(RecipeError, match="may not start with '-'"):
        pull_recipe((tmp_path / "x.git").as_uri(), revision="--upload-pack=touch", dest=tmp_path / "out")
    assert not marker.exists()


# ---- malicious and broken recipes ------------------------------------------------------------------------------


def test_python_object_tag_is_refused_and_never_constructed(tmp_path):
    marker = tmp_path / "pwned"
    evil = _write(tmp_path / "evil.yaml",
                  f"loss_type: gmpo\nreward_funcs: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(RecipeError, match=r"line 2: YAML tag 'tag:yaml.org,2002:python/object/apply:os.system'|"
                                          r"line 2: YAML tag '!!python/object/apply:os.system'"):
        load_recipe(evil)
    with pytest.raises(SystemExit, match="YAML tag"):
        main(["recipe", "pull", str(evil), "--dest", str(tmp_path / "out")])
    assert not marker.exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("text, message", [
    ("loss_type: !custom gmpo\n", "YAML tag '!custom'"),
    ("beta: !!float 0.1\n", "YAML tag"),
    ("a: &x [1]\nb: *x\n", "anchors and aliases"),
    ("%TAG ! tag:example.com,2000:\n---\nloss_type: gmpo\n", "directive"),
    ("loss_type: gmpo\nloss_type: grpo\n", "'loss_type' is set twice"),
    ("- loss_type\n- gmpo\n", "must be a YAML mapping"),
    ("loss_type: [unclosed\n", "not valid YAML"),
])
def test_yaml_features_that_recipes_do_not_need_are_refused(text, message):
    with pytest.raises(RecipeError, match=message):
        parse_recipe_yaml(text)


def test_import_path_rewards_need_the_users_opt_in(tmp_path):
    evil = _write(tmp_path / "evil.yaml", "loss_type: gmpo\nreward_funcs: [accuracy_reward, os.system]\n")
    with pytest.raises(RecipeError, match="'os.system' is an import path.*Refused; pass --allow_reward_imports"):
        load_recipe(evil)
    config, _ = load_recipe(evil, allow_reward_imports=True)  # validated, not imported
    assert config["reward_funcs"] == ["accuracy_reward", "os.system"]
    with pytest.raises(RecipeError, match="'no_such_reward' is not a registered reward"):
        load_recipe(_write(tmp_path / "r.yaml", "reward_funcs: [no_such_reward]\n"))
    # the recipe cannot opt itself in
    with pytest.raises(RecipeError, match="'allow_reward_imports' refused: only you can allow"):
        load_recipe(_write(tmp_path / "s.yaml", "allow_reward_imports: true\nreward_funcs: [os.system]\n"))


def test_a_10mb_local_recipe_is_refused(tmp_path):
    huge = tmp_path / "huge.yaml"
    huge.write_bytes(b"# padding\n" * (1024 * 1024))  # 10 MiB
    assert huge.stat().st_size > MAX_RECIPE_BYTES
    with pytest.raises(RecipeError, match="10485760 bytes; a recipe may be at most 1000000 bytes"):
        load_recipe(huge)
    with pytest.raises(SystemExit, match="at most 1000000 bytes"):
        main(["recipe", "check", str(huge)])


@pytest.mark.parametrize("text, message", [
    ("env:\n  LD_PRELOAD: /tmp/evil.so\n", "'env' refused"),
    ("trust_remote_code: true\n", "trust_remote_code: true would run"),
    ("model_init_kwargs:\n  trust_remote_code: true\n", "trust_remote_code: true would run"),
    ("output_dir: /etc/cron.d\n", "points outside the working folder"),
    ("output_dir: ../../outside\n", "points outside the working folder"),
    ("los_type: gmpo\n", "unknown field.*'los_type' \\(did you mean loss_type"),
    ("loss_type: gmpo\nnum_generations: many\n", "does not parse as trl-groupx grpo arguments.*num_generations"),
    ("gmpo_clip: 0.3\n", "invalid configuration: gmpo_clip=0.3 belongs to variant 'gmpo'"),
])
def test_dangerous_or_invalid_fields_are_refused(tmp_path, text, message):
    with pytest.raises(RecipeError, match=message):
        load_recipe(_write(tmp_path / "r.yaml", text))


def test_env_in_a_recipe_never_reaches_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("TRL_GROUPX_TEST_ENV", raising=False)
    with pytest.raises(RecipeError):
        load_recipe(_write(tmp_path / "r.yaml", "env:\n  TRL_GROUPX_TEST_ENV: x\n"))
    import os

    assert "TRL_GROUPX_TEST_ENV" not in os.environ


def test_remote_code_opt_in(tmp_path):
    _, (_, training_args, _) = load_recipe(_write(tmp_path / "r.yaml", "trust_remote_code: true\n"),
                                           allow_remote_code=True)
    assert training_args.trust_remote_code is True


def test_check_command_reports_variants(capsys):
    main(["recipe", "check", str(GMPO)])
    assert "OK; variants: {'objective': 'gmpo'}" in capsys.readouterr().out


def test_classify_source():
    assert classify_source("alice/recipes") == "hub"
    assert classify_source("alice/recipes:sub/x.yaml") == "hub"
    assert classify_source("https://github.com/a/b.git") == "git"
    assert classify_source("git@github.com:a/b.git") == "git"
    assert classify_source("./here") == "local"
    with pytest.raises(RecipeError, match="not a Hub repo id"):
        classify_source("what is this?")
