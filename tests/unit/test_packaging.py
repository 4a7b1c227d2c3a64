"""The package metadata as setuptools reads it: no deprecation (`project.license` as a TOML
table warned on every install), and the console script that runs rmctl."""

from __future__ import annotations

import warnings

from setuptools.config.pyprojecttoml import apply_configuration  # type: ignore[import-untyped]
from setuptools.dist import Distribution  # type: ignore[import-untyped]

from tests.support.env import ROOT


def test_setuptools_reads_pyproject_without_warnings() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert [str(w.message).splitlines()[0] for w in caught] == []
    assert dist.metadata.license_expression == "Apache-2.0"
    scripts = dist.entry_points["console_scripts"]
    assert "rmctl = rmctl:main" in scripts
