"""What a Space sets, the studio honours: GRADIO_SERVER_NAME / GRADIO_SERVER_PORT / PORT, the
JVM-free engine where the `spaces` package is, and a Python floor the pins allow."""

from __future__ import annotations

import tomllib
from importlib.metadata import PackageNotFoundError, metadata
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

import app.__main__ as studio_main
from agent.config import add_retriever_flags, default_engine

ROOT = Path(__file__).resolve().parent.parent
SERVER_VARS = ("GRADIO_SERVER_NAME", "GRADIO_SERVER_PORT", "PORT")


@pytest.fixture
def clean_env(monkeypatch):
    for name in (*SERVER_VARS, "RETRIEVER_ENGINE"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def parse(*argv: str):
    return studio_main.parse_args(["--model", "nano", *argv])


def test_loopback_and_7860_without_any_variable(clean_env):
    args = parse()
    assert (args.host, args.port) == ("127.0.0.1", 7860)


def test_a_space_sets_the_address_and_gradio_port(clean_env):
    clean_env.setenv("GRADIO_SERVER_NAME", "0.0.0.0")
    clean_env.setenv("GRADIO_SERVER_PORT", "7861")
    clean_env.setenv("PORT", "8080")  # Gradio's own variable wins
    args = parse()
    assert (args.host, args.port) == ("0.0.0.0", 7861)


def test_port_is_the_fallback_hosts_set(clean_env):
    clean_env.setenv("PORT", "8080")
    assert parse().port == 8080
    assert parse("--port", "9000").port == 9000  # the flag wins


@pytest.mark.parametrize("value", ["abc", "0", "70000"])
def test_a_bad_port_variable_is_a_clear_error(clean_env, capsys, value):
    clean_env.setenv("PORT", value)
    with pytest.raises(SystemExit) as stop:
        parse()
    assert stop.value.code == 2
    assert f"{value!r} is not a port" in capsys.readouterr().err


def engine_of(*argv: str) -> str:
    import argparse

    parser = argparse.ArgumentParser()
    add_retriever_flags(parser)
    return parser.parse_args(list(argv)).engine


@pytest.fixture
def spaces_importable(tmp_path, clean_env):
    """A stand-in `spaces` package on sys.path (as Hugging Face Spaces install the real one)."""
    package = tmp_path / "site" / "spaces"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('"""Stand-in for the Spaces package."""\n')
    clean_env.syspath_prepend(str(tmp_path / "site"))
    return clean_env


def test_without_spaces_the_default_engine_is_lucene(clean_env):
    try:
        import spaces  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("the `spaces` package is installed here")
    assert default_engine() == "lucene"
    assert engine_of() == "lucene"


def test_where_spaces_is_importable_the_default_engine_is_bm25s(spaces_importable):
    assert default_engine() == "bm25s"
    assert engine_of() == "bm25s"
    assert engine_of("--engine", "lucene") == "lucene"  # a named engine still wins
    spaces_importable.setenv("RETRIEVER_ENGINE", "dense")
    assert engine_of() == "dense"


def test_requires_python_is_the_lowest_version_every_pin_supports():
    """The floor in pyproject.toml is exactly the oldest Python that all the installed pinned
    packages declare support for."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    floor = SpecifierSet(project["project"]["requires-python"])
    pins = [line.split("#")[0].strip() for line in
            (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines()]
    declared = []
    for pin in filter(None, pins):
        name = pin.split("==")[0]
        try:
            declared.append(SpecifierSet(metadata(name).get("Requires-Python") or ""))
        except PackageNotFoundError:
            continue
    assert len(declared) > 20
    versions = [f"3.{minor}" for minor in range(8, 20)]
    supported = [v for v in versions if all(v in spec for spec in declared)]
    assert supported, "no Python version satisfies every pin"
    assert [v for v in versions if v in floor][0] == supported[0] == "3.11"
